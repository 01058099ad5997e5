package room

import (
	"context"
	"math"

	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/kubernetes/pkg/scheduler/util"
)

// OrderedScoreFuncs choose the node among the candidates: the fewest
// PodDisruptionBudgets violated, then the fewest victims, then the lowest
// highest priority, the lowest sum of priorities, the latest start.
// DefaultPreemption puts the highest priority before the number of
// victims.
func (pl *Preemption) OrderedScoreFuncs(_ context.Context, nodesToVictims map[string]*extenderv1.Victims) []func(node string) int64 {
	return []func(string) int64{
		func(n string) int64 { return -nodesToVictims[n].NumPDBViolations },
		func(n string) int64 { return -int64(len(nodesToVictims[n].Pods)) },
		func(n string) int64 {
			highest := int32(math.MinInt32)
			for _, p := range nodesToVictims[n].Pods {
				highest = max(highest, corev1helpers.PodPriority(p))
			}
			return -int64(highest)
		},
		func(n string) int64 {
			var sum int64
			for _, p := range nodesToVictims[n].Pods {
				sum += int64(corev1helpers.PodPriority(p)) + int64(math.MaxInt32+1)
			}
			return -sum
		},
		func(n string) int64 {
			if t := util.GetEarliestPodStartTime(nodesToVictims[n]); t != nil {
				return t.UnixNano()
			}
			return math.MinInt64
		},
	}
}
