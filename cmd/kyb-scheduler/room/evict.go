package room

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Event reasons of defragmentation.
const (
	// ReasonDefragmenting is on the waiting pod: pods are moved for it.
	ReasonDefragmenting = "Defragmenting"
	// ReasonDefragmented is on each pod evicted for it.
	ReasonDefragmented = "Defragmented"
	// ReasonDefragmentationDryRun is on both, in a dry run.
	ReasonDefragmentationDryRun = "DefragmentationDryRun"
)

// evictTimeout bounds one eviction's API call.
const evictTimeout = 10 * time.Second

// report says, in the log and in events on the waiting pod and on each
// pod to move, what a defragmentation moves, where it found each pod
// fits, and for whom. A consolidation's waiting pod is nil.
func (pl *Preemption) report(ctx context.Context, waiting *v1.Pod, p *plan, dryRun bool) {
	logger := klog.FromContext(ctx)
	recorder := pl.fh.EventRecorder()
	var where []string
	fitsOn := map[types.UID]string{}
	for _, m := range p.moves {
		where = append(where, fmt.Sprintf("%s/%s to %s", m.pod.Namespace, m.pod.Name, m.node))
		fitsOn[m.original] = "on node " + m.node
	}
	forWhom := "a whole group of the largest size (consolidation)"
	if waiting != nil {
		forWhom = "pod " + waiting.Namespace + "/" + waiting.Name
	}
	reason, action, verb := ReasonDefragmenting, "Evicting", "Moving"
	if dryRun {
		reason, action, verb = ReasonDefragmentationDryRun, "DryRun", "Would move"
	}
	logger.Info(verb+" pods to free devices", "dryRun", dryRun, "for", forWhom, "node", p.node, "pods", klog.KObjSlice(p.victims), "fitsOn", where)
	if waiting != nil {
		recorder.Eventf(waiting, nil, v1.EventTypeNormal, reason, action, "%s %s off node %s to free devices for this pod (replacements fit: %s)",
			verb, names(p.victims), p.node, strings.Join(where, ", "))
	}
	if !dryRun {
		reason = ReasonDefragmented
	}
	for _, v := range p.victims {
		note := "Evicted to free devices on node %s for %s; its controller recreates it, and it fits"
		if dryRun {
			note = "Would be evicted to free devices on node %s for %s (dry run); it would fit"
		}
		note += " " + fitsOn[v.UID]
		if waiting != nil {
			recorder.Eventf(v, waiting, v1.EventTypeNormal, reason, action, note, p.node, forWhom)
		} else {
			recorder.Eventf(v, nil, v1.EventTypeNormal, reason, action, note, p.node, forWhom)
		}
	}
}

// evictAll evicts the plan's pods through the Eviction API, which honours
// their PodDisruptionBudgets: the API server refuses an eviction a budget
// does not allow, and the pods after it stay.
func (pl *Preemption) evictAll(ctx context.Context, waiting *v1.Pod, p *plan) error {
	client := pl.fh.ClientSet()
	for i, v := range p.victims {
		ectx, cancel := context.WithTimeout(ctx, evictTimeout)
		err := client.CoreV1().Pods(v.Namespace).EvictV1(ectx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: v.Name, Namespace: v.Namespace},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &v.UID}},
		})
		cancel()
		if err != nil {
			if waiting != nil {
				pl.fh.EventRecorder().Eventf(waiting, nil, v1.EventTypeWarning, ReasonDefragmenting, "Evicting",
					"Stopped after %d of %d evictions on node %s: %s/%s: %v", i, len(p.victims), p.node, v.Namespace, v.Name, err)
			}
			return fmt.Errorf("evict %s/%s (%d of %d) on node %s: %w", v.Namespace, v.Name, i+1, len(p.victims), p.node, err)
		}
	}
	return nil
}
