package placement

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
)

// extendedRequests are the requests of the claim the DynamicResources
// plugin makes for the pod's extended resources that DeviceClasses serve
// (KEP-5004), built as it builds them (createRequestsAndMappings in
// k8s.io/kubernetes v1.37.1): for each resource, one request per
// container that runs with the pod (regular containers and sidecars), of
// that container's count; an init container that runs to completion
// first reuses the devices of the containers after it and asks for the
// rest only, and the largest such rest of the resource is one request
// more. The allocator takes the requests in the order of their names.
//
// The requests' shape is what matters, not only their total: a shared
// group gives one request one device, however many seats it has left,
// where two requests can both take a share of it.
func extendedRequests(pod *v1.Pod, resolver fwk.DeviceClassResolver) []request {
	nInit := len(pod.Spec.InitContainers)
	containers := append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
	shortLived := func(i int) bool {
		c := containers[i]
		return i < nInit && (c.RestartPolicy == nil || *c.RestartPolicy != v1.ContainerRestartPolicyAlways)
	}
	var names []v1.ResourceName
	for _, c := range containers {
		for name := range c.Resources.Requests {
			if schedutil.IsDRAExtendedResourceName(name) && !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	type named struct {
		name string
		req  request
	}
	var out []named
	for _, resource := range names {
		class := resolver.GetDeviceClass(resource)
		if class == nil {
			continue
		}
		add := func(i int, count int64) named {
			alt := alternative{class: class, classKey: classKey(class), count: count, seats: 1}
			return named{name: requestName(i, &containers[i], resource), req: request{alternatives: []alternative{alt}}}
		}
		long := make([]int64, len(containers))
		for i := range containers {
			if !shortLived(i) {
				long[i] = containerCount(&containers[i], resource)
				if long[i] > 0 {
					out = append(out, add(i, long[i]))
				}
			}
		}
		var rest named
		for i := range containers {
			if !shortLived(i) {
				continue
			}
			n := containerCount(&containers[i], resource)
			reused := int64(0)
			for _, m := range long[i:] {
				if reused >= n {
					break
				}
				reused += m
			}
			if n > reused && (len(rest.req.alternatives) == 0 || rest.req.alternatives[0].count < n-reused) {
				rest = add(i, n-reused)
			}
		}
		if rest.req.alternatives != nil {
			out = append(out, rest)
		}
	}
	slices.SortFunc(out, func(a, b named) int { return strings.Compare(a.name, b.name) })
	reqs := make([]request, len(out))
	for i, n := range out {
		reqs[i] = n.req
	}
	return reqs
}

// containerCount is how many devices of resource the container requests;
// 0 where it requests none or no whole number.
func containerCount(c *v1.Container, resource v1.ResourceName) int64 {
	q, ok := c.Resources.Requests[resource]
	if !ok {
		return 0
	}
	n, ok := q.AsInt64()
	if !ok || n < 0 {
		return 0
	}
	return n
}

// requestName is the name the DynamicResources plugin gives container i's
// request of resource: the container's index among init and regular
// containers, the resource's among the container's requests, by name.
func requestName(i int, c *v1.Container, resource v1.ResourceName) string {
	keys := make([]string, 0, len(c.Resources.Requests))
	for k := range c.Resources.Requests {
		keys = append(keys, string(k))
	}
	slices.Sort(keys)
	return fmt.Sprintf("container-%d-request-%d", i, max(slices.Index(keys, string(resource)), 0))
}
