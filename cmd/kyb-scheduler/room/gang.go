package room

import (
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
)

// victim is a candidate for eviction, with the nodes its pods run on.
type victim struct {
	preemption.Victim
	nodes map[string]fwk.NodeInfo
}

// wholeGangs are the candidates with the pods of a gang as one: a pod
// of a PodGroup with a gang policy stands for every scheduled pod of the
// group, on whatever node, and is evicted with them or not at all.
// DefaultPreemption does so only for groups with the disruption mode
// All; a gang below its minimum count would hold its devices idle.
func (pl *Preemption) wholeGangs(all []*preemption.DomainVictim) []*victim {
	snapshot := pl.fh.SnapshotSharedLister()
	seen := sets.New[fwk.EntityKey]()
	var out []*victim
	for _, dv := range all {
		v := &victim{Victim: dv, nodes: dv.AffectedNodes()}
		pods := dv.Pods()
		if len(pods) != 1 || pods[0].GetPod().Spec.SchedulingGroup == nil || pods[0].GetPod().Spec.SchedulingGroup.PodGroupName == nil {
			out = append(out, v)
			continue
		}
		p := pods[0].GetPod()
		name := *p.Spec.SchedulingGroup.PodGroupName
		pg, err := snapshot.PodGroups().Get(p.Namespace, name)
		if err != nil || pg.Spec.SchedulingPolicy.Gang == nil {
			out = append(out, v)
			continue
		}
		key := fwk.PodGroupKey(p.Namespace, name)
		if seen.Has(key) {
			continue
		}
		seen.Insert(key)
		state, err := snapshot.PodGroupStates().Get(p.Namespace, name)
		if err != nil {
			out = append(out, v)
			continue
		}
		var infos []fwk.PodInfo
		nodes := map[string]fwk.NodeInfo{}
		for _, member := range state.ScheduledPods() {
			pi, err := framework.NewPodInfo(member)
			if err != nil {
				continue
			}
			infos = append(infos, pi)
			if ni, err := snapshot.NodeInfos().Get(member.Spec.NodeName); err == nil {
				nodes[member.Spec.NodeName] = ni
			}
		}
		gang, err := preemption.NewVictim(infos, dv.Priority(), fwk.PodGroupKeyType)
		if err != nil {
			out = append(out, v)
			continue
		}
		out = append(out, &victim{Victim: gang, nodes: nodes})
	}
	return out
}

// gangRelease is the release of a pod group preemption's dry run.
type gangRelease struct{}

func (g *gangRelease) apply(fwk.CycleState, fwk.SharedDRAManager) {}
