package placement

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// request is one device request of the pod still to be allocated: its
// alternatives in the order the allocator tries them (a firstAvailable
// request's subrequests; one for an exact request).
type request struct {
	alternatives []alternative
}

type alternative struct {
	class *resourceapi.DeviceClass
	// classKey: classKey(class), once per pod, not per node.
	classKey string
	// count devices, each taking seats of a shared group.
	count int64
	seats int64
	// memory and compute: what it asks of a sized group (sizes.go);
	// names, every capacity it asks for.
	memory, compute asked
	names           []resourceapi.QualifiedName
}

// podRequests are the device requests the pod still needs allocated: those
// of its ResourceClaims that are neither allocated nor in flight for
// another pod, and those of the extended resources DeviceClasses serve
// (KEP-5004: the scheduler allocates a claim for them, extended.go). Requests of
// classes that do not exist are left out; Filter has refused such pods.
func podRequests(pod *v1.Pod, dra fwk.SharedDRAManager) []request {
	return cycleRequests(nil, pod, dra)
}

// cycleRequests are podRequests, where the cycle has the pod's claims as
// they will be (dynamicresources.PodClaims: a pod that defragmentation
// would move, or one that does not exist yet) from those: a claim of
// them without an allocation is to be allocated.
func cycleRequests(state fwk.CycleState, pod *v1.Pod, dra fwk.SharedDRAManager) []request {
	var out []request
	if given := givenClaims(state); given != nil {
		for _, claim := range given.Claims {
			if claim.Status.Allocation != nil {
				continue
			}
			for _, r := range claim.Spec.Devices.Requests {
				if req, ok := claimRequest(r, dra.DeviceClasses()); ok {
					out = append(out, req)
				}
			}
		}
		return append(out, extendedRequestsOf(pod, dra)...)
	}
	for _, rc := range pod.Spec.ResourceClaims {
		name := claimName(pod, rc)
		if name == "" {
			continue
		}
		// A claim the tracker does not have is the Filter's to report.
		claim, err := dra.ResourceClaims().Get(pod.Namespace, name)
		if err != nil {
			continue
		}
		if claim.Status.Allocation != nil || dra.ResourceClaims().GetPendingAllocation(claim.UID) != nil {
			continue
		}
		for _, r := range claim.Spec.Devices.Requests {
			if req, ok := claimRequest(r, dra.DeviceClasses()); ok {
				out = append(out, req)
			}
		}
	}
	return append(out, extendedRequestsOf(pod, dra)...)
}

func extendedRequestsOf(pod *v1.Pod, dra fwk.SharedDRAManager) []request {
	resolver := dra.DeviceClassResolver()
	if resolver == nil {
		return nil
	}
	return extendedRequests(pod, resolver)
}

// givenClaims are the pod's claims a plugin gave the cycle, if any.
func givenClaims(state fwk.CycleState) *dynamicresources.PodClaims {
	if state == nil {
		return nil
	}
	d, err := state.Read(dynamicresources.PodClaimsKey)
	if err != nil {
		return nil
	}
	c, _ := d.(*dynamicresources.PodClaims)
	return c
}

// needsDevices says, without looking any object up, whether a pod may
// ask for devices: the cheap test that lets every other pod skip the
// score.
func needsDevices(pod *v1.Pod, dra fwk.SharedDRAManager) bool {
	if len(pod.Spec.ResourceClaims) > 0 {
		return true
	}
	resolver := dra.DeviceClassResolver()
	if resolver == nil {
		return false
	}
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, list := range []v1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
				for name := range list {
					if schedutil.IsDRAExtendedResourceName(name) && resolver.GetDeviceClass(name) != nil {
						return true
					}
				}
			}
		}
	}
	return false
}

func claimName(pod *v1.Pod, rc v1.PodResourceClaim) string {
	if rc.ResourceClaimName != nil {
		return *rc.ResourceClaimName
	}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == rc.Name && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}

func claimRequest(r resourceapi.DeviceRequest, classes fwk.DeviceClassLister) (request, bool) {
	var req request
	add := func(className string, mode resourceapi.DeviceAllocationMode, count int64, capacity *resourceapi.CapacityRequirements, adminAccess *bool) {
		// Admin access takes no device away; "All" takes every matching
		// device wherever it goes, which no node choice changes.
		if ptr.Deref(adminAccess, false) || mode == resourceapi.DeviceAllocationModeAll {
			return
		}
		class, err := classes.Get(className)
		if err != nil {
			return
		}
		req.alternatives = append(req.alternatives, alternative{
			class: class, classKey: classKey(class), count: max(count, 1), seats: seatsOf(capacity),
			memory: askedOf(capacity, memoryCapacity), compute: askedOf(capacity, computeCapacity), names: capacityNames(capacity),
		})
	}
	switch {
	case r.Exactly != nil:
		e := r.Exactly
		add(e.DeviceClassName, e.AllocationMode, e.Count, e.Capacity, e.AdminAccess)
	default:
		for _, s := range r.FirstAvailable {
			add(s.DeviceClassName, s.AllocationMode, s.Count, s.Capacity, nil)
		}
	}
	return req, len(req.alternatives) > 0
}

// seatsOf is how many seats a request takes of each shared group: what it
// asks for (as "seats" or with our domain), else one, the request policy's
// default.
func seatsOf(c *resourceapi.CapacityRequirements) int64 {
	if c == nil {
		return 1
	}
	for name, q := range c.Requests {
		if n := strings.TrimPrefix(string(name), driver.Name+"/"); n == string(seatsCapacity) && q.Value() > 0 {
			return q.Value()
		}
	}
	return 1
}

// classNames are the classes of the requests' alternatives, in order.
func classNames(reqs []request) []string {
	var out []string
	for _, r := range reqs {
		for _, a := range r.alternatives {
			out = append(out, a.class.Name)
		}
	}
	return out
}

// predictionKey names what a prediction depends on besides the pool's
// state: the requests' alternatives (the class's version, the count, the
// seats, the sizes, the capacities named) and whether the devices are
// tried in the cycle's order.
func predictionKey(reqs []request, ordered bool) string {
	var b strings.Builder
	if ordered {
		b.WriteString("ordered")
	}
	for _, r := range reqs {
		b.WriteByte('|')
		for _, alt := range r.alternatives {
			fmt.Fprintf(&b, "%s,%d,%d", alt.classKey, alt.count, alt.seats)
			for _, a := range []asked{alt.memory, alt.compute} {
				if a.ok {
					fmt.Fprintf(&b, ",%d", a.value)
				} else {
					b.WriteString(",-")
				}
			}
			for _, n := range slices.Sorted(slices.Values(alt.names)) {
				fmt.Fprintf(&b, ",%q", n)
			}
			b.WriteByte(';')
		}
	}
	return b.String()
}
