package containerclaims

import (
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// A pod whose containers ask for an extended resource backed by this
// driver (a DeviceClass's extendedResourceName in resources.requests)
// gets one claim that the scheduler makes for the whole pod, annotated
// resource.kubernetes.io/extended-resource-claim: "true", with one
// request per container and resource, named container-<i>-request-<j>:
// i is the container's index among the pod's init containers and then its
// containers, j the resource's among the container's sorted requests
// (kube-scheduler 1.37, dynamicresources/extendeddynamicresources.go,
// createResourceRequestAndMappings). The kubelet gives a container the
// requests that pod.status.extendedResourceClaimStatus maps to it
// (cm/dra GetResources), and for a container or a sidecar those are the
// requests named with its own index; yet its PodResources API lists the
// claim whole for every container with a mapping. Taken whole, such a
// claim with two containers would be combined, and each container would
// name its own GPU by index for no reason.
//
// The plugin reads no pod, so it takes the container from the request's
// name, a convention of the scheduler's and not an API: a claim whose
// requests do not all read that way is taken whole, as any other claim
// (combined when it has several requests). One case the names cannot
// tell: an init container that is not a sidecar may be mapped to the
// requests of containers after it (the scheduler lets it reuse theirs),
// and the kubelet does not list it; holding two of them, it sees the GPUs
// of the request the runtime applies last.

// extendedResourceClaim reports whether the scheduler made the claim for
// a pod's extended resources.
func extendedResourceClaim(c *resourceapi.ResourceClaim) bool {
	return c != nil && c.Annotations[resourceapi.ExtendedResourceClaimAnnotation] == "true"
}

// extendedRequestContainer reads the container index from the name the
// scheduler gives a request of an extended-resource claim.
func extendedRequestContainer(request string) (int, bool) {
	rest, ok := strings.CutPrefix(request, "container-")
	if !ok {
		return 0, false
	}
	i, j, ok := strings.Cut(rest, "-request-")
	if !ok || !digits(i) || !digits(j) {
		return 0, false
	}
	n, err := strconv.Atoi(i)
	return n, err == nil
}

func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// requestGroup is a set of a claim's requests that one container may hold
// together, and the GPUs their devices hold.
type requestGroup struct {
	requests map[string]bool
	gpus     map[int]bool
}

// requestGroups splits c's requests by the containers that may hold them:
// one group for the whole claim, or, for an extended-resource claim
// (perContainer) whose requests all carry the scheduler's names, one
// group per container index. Groups come in the order of their first
// device.
func requestGroups(c *checkpoint.Claim, perContainer bool) []requestGroup {
	if perContainer {
		for _, dev := range c.Devices {
			for _, r := range dev.Requests {
				if _, ok := extendedRequestContainer(r); !ok {
					perContainer = false
				}
			}
		}
	}
	var groups []requestGroup
	index := map[int]int{}
	for _, dev := range c.Devices {
		for _, r := range dev.Requests {
			key := 0
			if perContainer {
				key, _ = extendedRequestContainer(r)
			}
			i, ok := index[key]
			if !ok {
				i = len(groups)
				index[key] = i
				groups = append(groups, requestGroup{requests: map[string]bool{}, gpus: map[int]bool{}})
			}
			groups[i].requests[r] = true
			for _, g := range dev.GPUs {
				groups[i].gpus[g] = true
			}
		}
	}
	return groups
}

// RequestsApart reports whether no container can hold two of c's
// requests, as their names say: every request is named as the scheduler
// names an extended-resource claim's, one per container index. A spec
// whose entry the ledger did not mark combined (one recorded before the
// ledger decided this, or rebuilt without its spec) falls back on it.
func RequestsApart(c *checkpoint.Claim) bool {
	// Names that do not all read so make one group.
	groups := requestGroups(c, true)
	if len(groups) < 2 {
		return false
	}
	for _, g := range groups {
		if len(g.requests) > 1 {
			return false
		}
	}
	return true
}
