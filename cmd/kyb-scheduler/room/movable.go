package room

import (
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
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
// not, why: its controller recreates it, it did not opt out, it is no
// member of a pod group (a gang's pods go together or not at all), it is
// not leaving already, and every claim it has is its own, so that its new
// claims are allocated afresh wherever it goes. A claim it shares with
// another pod stays allocated where it is, and so would hold the pod's
// replacement to this node.
func movable(dra fwk.SharedDRAManager, pod *v1.Pod) (bool, string) {
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
	if _, ok := freshClaims(dra, pod); !ok {
		return false, "a claim it does not hold alone"
	}
	return true, ""
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
