package podresources

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodClaims is what the kubelet says of one pod's ResourceClaims: which
// claims each of its containers references.
type PodClaims struct {
	Namespace, Name string
	// Containers are the pod's containers and its sidecars (restartable
	// init containers); the kubelet leaves out other init containers.
	Containers []ContainerClaims
}

// ContainerClaims are the claims one container references.
type ContainerClaims struct {
	Name string
	// Claims are every claim the container references, of any driver.
	// The kubelet names a claim whole: a container that references one
	// request of a claim is listed with the claim, as one that references
	// all of them.
	Claims []types.NamespacedName
}

// Container returns the named container's claims; ok is false when the
// kubelet did not list it.
func (p PodClaims) Container(name string) (ContainerClaims, bool) {
	for _, c := range p.Containers {
		if c.Name == name {
			return c, true
		}
	}
	return ContainerClaims{}, false
}

// References reports whether any of the pod's containers references the
// claim.
func (p PodClaims) References(claim types.NamespacedName) bool {
	for _, c := range p.Containers {
		for _, x := range c.Claims {
			if x == claim {
				return true
			}
		}
	}
	return false
}

// ClaimsReader tells which claims each container of a pod references:
// Client, or a fake in tests.
type ClaimsReader interface {
	PodClaims(ctx context.Context, namespace, name string) (PodClaims, error)
}

// PodClaims asks the kubelet which claims each container of a pod
// references (v1 Get, GA in Kubernetes 1.36). The kubelet answers from
// its claim cache, which holds every claim of a pod from the moment it
// starts preparing them, before it calls a driver. A container whose
// claims the cache lacks (a pod not yet being prepared) is listed with
// none: the kubelet logs that and answers anyway.
func (c *Client) PodClaims(ctx context.Context, namespace, name string) (PodClaims, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	resp, err := c.lister.Get(ctx, &podresourcesapi.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
	if err != nil {
		return PodClaims{}, fmt.Errorf("get the resources of pod %s/%s at %s: %w", namespace, name, c.socket, err)
	}
	p := resp.GetPodResources()
	out := PodClaims{Namespace: p.GetNamespace(), Name: p.GetName()}
	for _, ctr := range p.GetContainers() {
		cc := ContainerClaims{Name: ctr.GetName()}
		for _, r := range ctr.GetDynamicResources() {
			ns := r.GetClaimNamespace()
			if ns == "" {
				// A pod references claims of its own namespace only.
				ns = namespace
			}
			cc.Claims = append(cc.Claims, types.NamespacedName{Namespace: ns, Name: r.GetClaimName()})
		}
		out.Containers = append(out.Containers, cc)
	}
	return out, nil
}

// RateLimited reports whether the kubelet refused a call for its rate
// limit: it limits its PodResources server as a whole, every client of
// the node together (Kubernetes 1.37: a burst of 10, then 100 a second),
// and answers a call over the limit at once with ResourceExhausted.
func RateLimited(err error) bool {
	return status.Code(err) == codes.ResourceExhausted
}
