package room

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
)

// PodEligibleToPreemptOthers is DefaultPreemption's, which lets a pod
// nominated to a node preempt again once no victim terminates there; a
// victim's devices are free only once its claims are released, after the
// pod is gone. Until then the pod waits too: else, tried again in that
// gap, it would evict a second set of victims on another node. The
// victims are those of the pod's last preemption (which the scheduler's
// informer may not show terminating yet), or, after a restart, any pod
// gone or terminating whose claim on the nominated node is not yet
// released.
func (pl *Preemption) PodEligibleToPreemptOthers(ctx context.Context, pod *v1.Pod, nominatedNodeStatus *fwk.Status) (bool, string) {
	if ok, msg := pl.DefaultPreemption.PodEligibleToPreemptOthers(ctx, pod, nominatedNodeStatus); !ok {
		return ok, msg
	}
	if pl.kept.leaving(pod.UID, pl.pods, pl.dra, gatheredFrom(ctx)) {
		return false, "not eligible due to the victims of its last preemption not gone yet, or their claims not released."
	}
	node := pod.Status.NominatedNodeName
	if node == "" || nominatedNodeStatus.Code() == fwk.UnschedulableAndUnresolvable {
		// Filter says the node cannot take the pod whatever leaves it.
		return true, ""
	}
	if pl.releasing(node) {
		return false, "not eligible due to claims of evicted pods on the nominated node not yet released."
	}
	return true, ""
}

// releasing reports whether an allocated claim on the node is reserved
// only for pods that are gone or terminating: the resource-claim
// controller is about to release it.
func (pl *Preemption) releasing(node string) bool {
	ni, err := pl.fh.SnapshotSharedLister().NodeInfos().Get(node)
	if err != nil || ni.Node() == nil {
		return false
	}
	claims, err := pl.dra.ResourceClaims().List()
	if err != nil {
		return false
	}
	for _, claim := range claims {
		a := claim.Status.Allocation
		if a == nil || a.NodeSelector == nil || len(claim.Status.ReservedFor) == 0 {
			continue
		}
		sel, err := nodeaffinity.NewNodeSelector(a.NodeSelector)
		if err != nil || !sel.Match(ni.Node()) {
			continue
		}
		leaving := true
		for _, r := range claim.Status.ReservedFor {
			if r.APIGroup != "" || r.Resource != "pods" {
				leaving = false
				break
			}
			p, err := pl.pods.Pods(claim.Namespace).Get(r.Name)
			if err == nil && p.UID == r.UID && p.DeletionTimestamp == nil {
				leaving = false
				break
			}
		}
		if leaving {
			return true
		}
	}
	return false
}

// EventsToRegister are DefaultPreemption's, and a claim's update or
// deletion. With asynchronous preemption, a preemptor is gated (PreEnqueue)
// while its victims are evicted, and a gated pod is tried again only on an
// event its gating plugin registered; DefaultPreemption registers a pod's
// deletion, but a pod with claims waits for its victims' claims to be
// released, which comes after: a release seen while the last victim was
// still being evicted would leave the preemptor gated with nothing to
// wake it. The hints of the plugins that rejected the pod decide, as for
// a pod's deletion.
func (pl *Preemption) EventsToRegister(ctx context.Context) ([]fwk.ClusterEventWithHint, error) {
	events, err := pl.DefaultPreemption.EventsToRegister(ctx)
	if err != nil || len(events) == 0 {
		return events, err
	}
	return append(events, fwk.ClusterEventWithHint{
		Event:          fwk.ClusterEvent{Resource: fwk.ResourceClaim, ActionType: fwk.Update | fwk.Delete},
		QueueingHintFn: func(klog.Logger, *v1.Pod, any, any) (fwk.QueueingHint, error) { return fwk.QueueSkip, nil },
	}), nil
}

// gatheredKey carries, in PostFilter's context, the allocated state its
// cycle gathered: the preemption's eligibility is judged by what the
// cycle saw.
type gatheredKey struct{}

func withGathered(ctx context.Context, cs fwk.CycleState) context.Context {
	d, err := cs.Read(dynamicresources.AllocatedStateKey)
	if err != nil {
		return ctx
	}
	if g, ok := d.(*dynamicresources.AllocatedStateData); ok && g.State != nil {
		return context.WithValue(ctx, gatheredKey{}, g.State)
	}
	return ctx
}

func gatheredFrom(ctx context.Context) *structured.AllocatedState {
	st, _ := ctx.Value(gatheredKey{}).(*structured.AllocatedState)
	return st
}
