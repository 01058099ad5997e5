// Package cri asks the node's container runtime, through its CRI API
// (the socket the kubelet uses), which pod and which of its containers a
// container ID belongs to: the one node-local source that maps the
// container IDs in processes' cgroups to pods and container names. It
// calls ListContainers with an ID filter and reads the labels the kubelet
// puts on every container; it reads nothing else (no container's
// environment, no pod spec).
package cri

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The labels the kubelet puts on every container it creates
// (pkg/kubelet/types/labels.go).
const (
	labelPodUID        = "io.kubernetes.pod.uid"
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelContainerName = "io.kubernetes.container.name"
)

// Container is a container the kubelet created.
type Container struct {
	ID                            string
	PodUID, PodNamespace, PodName string
	Name                          string
}

// ErrNotFound is returned for a container the runtime does not know.
var ErrNotFound = errors.New("no such container")

// Client asks the runtime over its socket. The connection is made on
// first use and made again after the runtime restarts.
type Client struct {
	socket  string
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	// Timeout bounds one call (default 2s).
	Timeout time.Duration
}

// NewClient returns a client of the runtime at socket; it does not
// connect yet.
func NewClient(socket string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("container runtime at %s: %w", socket, err)
	}
	return &Client{socket: socket, conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn), Timeout: 2 * time.Second}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Container returns the pod and name of the container with this ID;
// ErrNotFound when the runtime has none, or one the kubelet did not
// create (no pod labels).
func (c *Client) Container(ctx context.Context, id string) (Container, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	resp, err := c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: id}})
	if err != nil {
		return Container{}, fmt.Errorf("list container %s at %s: %w", id, c.socket, err)
	}
	// Runtimes match the ID filter by prefix; only the full ID counts.
	for _, ctr := range resp.GetContainers() {
		if ctr.GetId() != id {
			continue
		}
		l := ctr.GetLabels()
		out := Container{ID: id, PodUID: l[labelPodUID], PodNamespace: l[labelPodNamespace], PodName: l[labelPodName], Name: l[labelContainerName]}
		if out.PodUID == "" || out.PodNamespace == "" || out.PodName == "" || out.Name == "" {
			return Container{}, fmt.Errorf("container %s at %s: %w of a pod (its labels name no pod)", id, c.socket, ErrNotFound)
		}
		return out, nil
	}
	return Container{}, fmt.Errorf("container %s at %s: %w", id, c.socket, ErrNotFound)
}
