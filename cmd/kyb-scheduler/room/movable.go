package room

import (
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	fwk "k8s.io/kube-scheduler/framework"
)

// MovableAnnotation, set to "false" on a pod, keeps defragmentation from
// moving it. Any value but "true" does, so that a typo errs on the side
// of the pod.
const MovableAnnotation = "gpu.kyb.ai/movable"

// recreates says whether a pod's controller makes a new pod when one of
// its pods is evicted: a ReplicaSet (a Deployment's), a
// ReplicationController, a StatefulSet or a Job. A DaemonSet's pod comes
// back on the same node, and a bare pod does not come back.
func recreates(owner *metav1.OwnerReference) bool {
	gv, err := schema.ParseGroupVersion(owner.APIVersion)
	if err != nil {
		return false
	}
	switch (schema.GroupKind{Group: gv.Group, Kind: owner.Kind}) {
	case schema.GroupKind{Group: "apps", Kind: "ReplicaSet"},
		schema.GroupKind{Group: "", Kind: "ReplicationController"},
		schema.GroupKind{Group: "apps", Kind: "StatefulSet"},
		schema.GroupKind{Group: "batch", Kind: "Job"}:
		return true
	}
	return false
}

// movable says whether defragmentation may move a running pod, and if
// not, why: its controller recreates it (a Job's, jobs tells:
// jobReplaces), it did not opt out, it is no
// member of a pod group (a gang's pods go together or not at all), it is
// not leaving already, and every claim it has is its own, so that its new
// claims are allocated afresh wherever it goes. A claim it shares with
// another pod stays allocated where it is, and so would hold the pod's
// replacement to this node.
func movable(dra fwk.SharedDRAManager, jobs batchlisters.JobLister, pod *v1.Pod) (bool, string) {
	switch {
	case pod.DeletionTimestamp != nil:
		return false, "terminating"
	case pod.Spec.NodeName == "" || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return false, "not running"
	case pod.Annotations[MovableAnnotation] != "" && pod.Annotations[MovableAnnotation] != "true":
		return false, "annotation " + MovableAnnotation + "=" + pod.Annotations[MovableAnnotation]
	case pod.Spec.SchedulingGroup != nil:
		return false, "member of a pod group"
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil || !recreates(owner) {
		return false, "no controller that recreates it"
	}
	if owner.Kind == "Job" {
		if ok, why := jobReplaces(jobs, pod, owner); !ok {
			return false, why
		}
	}
	if _, ok := freshClaims(dra, pod); !ok {
		return false, "a claim it does not hold alone"
	}
	return true, ""
}

// jobReplaces says whether a Job makes a new pod for its evicted pod,
// and if not, why. An eviction counts as the pod's failure, unless its
// podFailurePolicy ignores the DisruptionTarget condition the Eviction
// API sets: with its failures at the backoffLimit (0 and restartPolicy
// Never is common for batch work), or its index's at
// backoffLimitPerIndex, the Job fails instead, as it does where its
// policy fails it on the condition. A Job the scheduler's informer does
// not have is not read as replacing.
func jobReplaces(jobs batchlisters.JobLister, pod *v1.Pod, owner *metav1.OwnerReference) (bool, string) {
	if jobs == nil {
		return false, "Job " + owner.Name + " not known"
	}
	job, err := jobs.Jobs(pod.Namespace).Get(owner.Name)
	if err != nil || job.UID != owner.UID {
		return false, "Job " + owner.Name + " not known"
	}
	switch onDisruption(job.Spec.PodFailurePolicy) {
	case batchv1.PodFailurePolicyActionIgnore:
		return true, ""
	case batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyActionFailIndex:
		return false, "its eviction would fail Job " + job.Name + " (podFailurePolicy)"
	}
	if limit := job.Spec.BackoffLimitPerIndex; limit != nil {
		failed, err := strconv.Atoi(pod.Annotations[batchv1.JobIndexFailureCountAnnotation])
		if err != nil || int32(failed) >= *limit {
			return false, "its eviction would fail its index of Job " + job.Name + " (backoffLimitPerIndex)"
		}
		return true, ""
	}
	limit := int32(6) // the API server's default
	if job.Spec.BackoffLimit != nil {
		limit = *job.Spec.BackoffLimit
	}
	if job.Status.Failed >= limit {
		return false, "its eviction would fail Job " + job.Name + " (backoffLimit)"
	}
	return true, ""
}

// onDisruption is what a pod failure policy does with an evicted pod's
// failure: the action of its first rule on the DisruptionTarget
// condition; empty (counted) where none. A rule before it on exit codes
// other than the listed ones may match the evicted container's exit code
// first, and its action is taken where it is not Ignore; one on listed
// codes is taken not to match.
func onDisruption(policy *batchv1.PodFailurePolicy) batchv1.PodFailurePolicyAction {
	if policy == nil {
		return ""
	}
	for _, r := range policy.Rules {
		if c := r.OnExitCodes; c != nil {
			if c.Operator == batchv1.PodFailurePolicyOnExitCodesOpNotIn && r.Action != batchv1.PodFailurePolicyActionIgnore {
				return r.Action
			}
			continue
		}
		for _, p := range r.OnPodConditions {
			if p.Type == v1.DisruptionTarget && p.Status == v1.ConditionTrue {
				return r.Action
			}
		}
	}
	return ""
}

// freshClaims are the pod's claims as its replacement will have them: in
// the order of its spec.resourceClaims, without an allocation or
// consumers. False where one is not in the scheduler's cache or another
// pod uses it too.
func freshClaims(dra fwk.SharedDRAManager, pod *v1.Pod) ([]*resourceapi.ResourceClaim, bool) {
	out := make([]*resourceapi.ResourceClaim, 0, len(pod.Spec.ResourceClaims))
	self := map[types.UID]struct{}{pod.UID: {}}
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil {
			return nil, false
		}
		if name == nil {
			continue
		}
		claim, err := dra.ResourceClaims().Get(pod.Namespace, *name)
		if err != nil {
			return nil, false
		}
		if claim.Status.Allocation != nil && !onlyUsedBy(claim, self) {
			return nil, false
		}
		fresh := claim.DeepCopy()
		fresh.Status = resourceapi.ResourceClaimStatus{}
		out = append(out, fresh)
	}
	return out, true
}

// replacement is the pod its controller makes in its place, as far as the
// Filter plugins can tell: no node, no status (a claim the scheduler made
// for its extended resources is made again), a UID of its own.
func replacement(pod *v1.Pod) *v1.Pod {
	out := pod.DeepCopy()
	out.UID = pod.UID + "-replacement"
	out.ResourceVersion = ""
	out.Spec.NodeName = ""
	out.Status = v1.PodStatus{Phase: v1.PodPending}
	return out
}
