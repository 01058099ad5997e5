package room

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// The objects of the fixture's cluster: pods, their claims, budgets and
// pod groups.

// podOpt shapes a pod.
type podOpt func(*v1.Pod)

func priority(p int32) podOpt { return func(pod *v1.Pod) { pod.Spec.Priority = &p } }

// started sets the pod's start time.
func started(t time.Time) podOpt {
	return func(pod *v1.Pod) { pod.Status.StartTime = &metav1.Time{Time: t} }
}

func labels(kv ...string) podOpt {
	return func(pod *v1.Pod) {
		pod.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			pod.Labels[kv[i]] = kv[i+1]
		}
	}
}

// ownedBy makes the pod a controller's: kind is ReplicaSet, StatefulSet
// or DaemonSet (apps/v1), Job (batch/v1) or ReplicationController (v1).
func ownedBy(kind string) podOpt {
	apiVersion := "apps/v1"
	switch kind {
	case "Job":
		apiVersion = "batch/v1"
	case "ReplicationController":
		apiVersion = "v1"
	}
	return func(pod *v1.Pod) {
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "owner", UID: "uid-owner", Controller: ptr.To(true)}}
	}
}

func annotated(k, v string) podOpt {
	return func(pod *v1.Pod) {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[k] = v
	}
}

func inGroup(name string) podOpt {
	return func(pod *v1.Pod) { pod.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: &name} }
}

func newPod(name string, opts ...podOpt) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{
			SchedulerName: "kyb-scheduler",
			Priority:      ptr.To[int32](0),
			Containers:    []v1.Container{{Name: "app"}},
		},
	}
	for _, o := range opts {
		o(pod)
	}
	return pod
}

// withClaim has the pod use a claim by name.
func withClaim(pod *v1.Pod, claim string) {
	entry := fmt.Sprintf("gpu%d", len(pod.Spec.ResourceClaims))
	pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, v1.PodResourceClaim{Name: entry, ResourceClaimName: &claim})
	pod.Spec.Containers[0].Resources.Claims = append(pod.Spec.Containers[0].Resources.Claims, v1.ResourceClaim{Name: entry})
}

// allocatedClaim is a claim for count devices of class, allocated on node
// to devices its GPUs' selector picks, and reserved for pods.
func (f *fixture) allocatedClaim(name, node, class string, count int64, gpus string, pods ...*v1.Pod) *resourceapi.ResourceClaim {
	f.t.Helper()
	var mutate []func(*resourceapi.DeviceRequest)
	if gpus != "" {
		mutate = append(mutate, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+gpus+`"`))
	}
	claim := schedulertest.Claim(name, class, count, mutate...)
	r, err := f.sim.Allocate(f.ctx, claim, node)
	if err != nil || r == nil {
		f.t.Fatalf("allocate %s on %s (GPUs %s): %v", name, node, gpus, err)
	}
	claim.Status.Allocation = r
	for _, p := range pods {
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	f.claims = append(f.claims, claim)
	return claim
}

// running adds a pod bound to node that holds count devices of class on
// the given GPUs through a claim of its own.
func (f *fixture) running(name, node, class string, count int64, gpus string, opts ...podOpt) *v1.Pod {
	f.t.Helper()
	pod := newPod(name, opts...)
	pod.Spec.NodeName = node
	pod.Status.Phase = v1.PodRunning
	claim := f.allocatedClaim(name+"-gpu", node, class, count, gpus, pod)
	withClaim(pod, claim.Name)
	f.pods = append(f.pods, pod)
	return pod
}

// runningExtended adds a pod bound to node that asks for n of an extended
// resource, served by the claim the scheduler made for it.
func (f *fixture) runningExtended(name, node string, resourceName v1.ResourceName, n int64, gpus string, opts ...podOpt) *v1.Pod {
	f.t.Helper()
	pod := extendedPod(name, resourceName, n, opts...)
	pod.Spec.NodeName = node
	pod.Status.Phase = v1.PodRunning
	claim, err := f.sim.ExtendedResourceClaim(name+"-extended-resources", resourceName, n)
	if err != nil {
		f.t.Fatal(err)
	}
	// Named as the scheduler names the request of a pod's only container.
	claim.Spec.Devices.Requests[0].Name = "container-0-request-0"
	f.allocatedClaimFrom(claim, node, gpus, pod)
	claim.Annotations = map[string]string{"resource.kubernetes.io/extended-resource-claim": "true"}
	claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
	pod.Status.ExtendedResourceClaimStatus = &v1.PodExtendedResourceClaimStatus{
		ResourceClaimName: claim.Name,
		RequestMappings:   []v1.ContainerExtendedResourceRequest{{ContainerName: "app", ResourceName: string(resourceName), RequestName: "container-0-request-0"}},
	}
	f.pods = append(f.pods, pod)
	return pod
}

func (f *fixture) allocatedClaimFrom(claim *resourceapi.ResourceClaim, node, gpus string, pods ...*v1.Pod) {
	f.t.Helper()
	if gpus != "" {
		r := &claim.Spec.Devices.Requests[0]
		schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "` + gpus + `"`)(r)
	}
	r, err := f.sim.Allocate(f.ctx, claim, node)
	if err != nil || r == nil {
		f.t.Fatalf("allocate %s on %s (GPUs %s): %v", claim.Name, node, gpus, err)
	}
	claim.Status.Allocation = r
	for _, p := range pods {
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	f.claims = append(f.claims, claim)
}

func extendedPod(name string, resourceName v1.ResourceName, n int64, opts ...podOpt) *v1.Pod {
	pod := newPod(name, opts...)
	q := *resource.NewQuantity(n, resource.DecimalSI)
	pod.Spec.Containers[0].Resources.Limits = v1.ResourceList{resourceName: q}
	pod.Spec.Containers[0].Resources.Requests = v1.ResourceList{resourceName: q}
	return pod
}

// pdb protects the pods with a label: at most allowed may go.
func (f *fixture) pdb(name string, allowed int32, kv ...string) {
	sel := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		sel[kv[i]] = kv[i+1]
	}
	f.pdbs = append(f.pdbs, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, MaxUnavailable: ptr.To(intstr.FromInt32(allowed))},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
	})
}

// gang is a PodGroup with a gang policy.
func (f *fixture) gang(name string, minCount, priority int32) {
	f.podGroups = append(f.podGroups, &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount}},
			Priority:         &priority,
		},
	})
}

// sharing adds pods bound to node that share one claim for a device of
// class on the given GPUs.
func (f *fixture) sharing(claim, node, class, gpus string, pods ...*v1.Pod) {
	f.t.Helper()
	c := f.allocatedClaim(claim, node, class, 1, gpus, pods...)
	for _, p := range pods {
		p.Spec.NodeName = node
		p.Status.Phase = v1.PodRunning
		withClaim(p, c.Name)
		f.pods = append(f.pods, p)
	}
}

// pendingOn is pending with a claim for one seat of class on the given
// GPUs (any where empty).
func (f *fixture) pendingOn(name, class, gpus string, opts ...podOpt) *v1.Pod {
	f.t.Helper()
	pod := newPod(name, opts...)
	var mutate []func(*resourceapi.DeviceRequest)
	if gpus != "" {
		mutate = append(mutate, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+gpus+`"`))
	}
	claim := schedulertest.Claim(name+"-gpu", class, 1, mutate...)
	f.create(claim)
	f.waitFor("claim "+claim.Name, func() bool { _, err := f.dra.ResourceClaims().Get(claim.Namespace, claim.Name); return err == nil })
	withClaim(pod, claim.Name)
	return f.submit(pod)
}
