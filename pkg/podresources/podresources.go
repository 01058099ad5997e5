// Package podresources reads, from the kubelet's PodResources API, which
// device-plugin devices and which claims the kubelet has assigned to the
// containers of its active pods. The device-plugin API never tells a
// plugin that a device was released; this is where the kubelet says which
// are still held.
package podresources

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is where the kubelet serves the API with its default root
// directory (<root-dir>/pod-resources/kubelet.sock).
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Assignment is the devices of one resource the kubelet assigned to one
// container.
type Assignment struct {
	// Pod is namespace/name.
	Pod       string
	Container string
	Resource  string
	IDs       []string
}

// Client lists assignments over the kubelet's socket. The connection is
// made on first use and made again after the kubelet restarts.
type Client struct {
	socket string
	conn   *grpc.ClientConn
	lister podresourcesapi.PodResourcesListerClient
	// Timeout bounds one List call (default 5s).
	Timeout time.Duration
}

// NewClient returns a client of the API at socket; it does not connect yet.
func NewClient(socket string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("pod resources API at %s: %w", socket, err)
	}
	return &Client{socket: socket, conn: conn, lister: podresourcesapi.NewPodResourcesListerClient(conn), Timeout: 5 * time.Second}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// ClaimAssignment is a claim one container references, with the drivers
// whose devices the kubelet prepared for it.
type ClaimAssignment struct {
	// Pod is namespace/name.
	Pod       string
	Container string
	Claim     types.NamespacedName
	Drivers   []string
}

// Listing is what the kubelet says of its active pods.
type Listing struct {
	// Pods are the active pods, namespace/name.
	Pods []string
	// Assignments are their containers' device-plugin devices.
	Assignments []Assignment
	// Claims are their containers' claims.
	Claims []ClaimAssignment
}

// List lists the active pods, their containers' device-plugin devices and
// their containers' claims.
func (c *Client) List(ctx context.Context) (Listing, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	resp, err := c.lister.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return Listing{}, fmt.Errorf("list pod resources at %s: %w", c.socket, err)
	}
	// The kubelet lists each device in an entry of its own, once per NUMA
	// node it reports; an assignment is the set of a container's IDs.
	var out []Assignment
	var claims []ClaimAssignment
	var pods []string
	for _, p := range resp.GetPodResources() {
		pods = append(pods, p.GetNamespace()+"/"+p.GetName())
		for _, ctr := range p.GetContainers() {
			claims = append(claims, containerClaims(p, ctr)...)
			first := len(out)
			for _, d := range ctr.GetDevices() {
				i := slices.IndexFunc(out[first:], func(a Assignment) bool { return a.Resource == d.GetResourceName() })
				if i < 0 {
					out = append(out, Assignment{Pod: p.GetNamespace() + "/" + p.GetName(), Container: ctr.GetName(), Resource: d.GetResourceName()})
					i = len(out) - 1 - first
				}
				a := &out[first+i]
				for _, id := range d.GetDeviceIds() {
					if !slices.Contains(a.IDs, id) {
						a.IDs = append(a.IDs, id)
					}
				}
			}
		}
	}
	out = slices.DeleteFunc(out, func(a Assignment) bool { return len(a.IDs) == 0 })
	return Listing{Pods: pods, Assignments: out, Claims: claims}, nil
}

// containerClaims are the claims a container references, with the drivers
// of their devices.
func containerClaims(p *podresourcesapi.PodResources, ctr *podresourcesapi.ContainerResources) []ClaimAssignment {
	var out []ClaimAssignment
	for _, r := range ctr.GetDynamicResources() {
		ns := r.GetClaimNamespace()
		if ns == "" {
			// A pod references claims of its own namespace only.
			ns = p.GetNamespace()
		}
		c := ClaimAssignment{Pod: p.GetNamespace() + "/" + p.GetName(), Container: ctr.GetName(), Claim: types.NamespacedName{Namespace: ns, Name: r.GetClaimName()}}
		for _, res := range r.GetClaimResources() {
			if d := res.GetDriverName(); !slices.Contains(c.Drivers, d) {
				c.Drivers = append(c.Drivers, d)
			}
		}
		out = append(out, c)
	}
	return out
}
