// Package critest serves the part of a container runtime's CRI API that
// package cri calls (ListContainers) over a real unix socket, from
// containers a test sets, labelled as the kubelet labels them. It is for
// tests only; no binary links it (hack/deps-check.sh).
package critest

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cri"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// Server is a runtime running the containers a test set.
type Server struct {
	// Socket is where it listens.
	Socket string

	runtimeapi.UnimplementedRuntimeServiceServer
	mu         sync.Mutex
	containers map[string]cri.Container
	lists      atomic.Int64
}

// TB is what Start needs of a test (testing.TB, or a harness's).
type TB = sockettest.TB

// Start serves the API at socket until the test ends.
func Start(tb TB, socket string) *Server {
	tb.Helper()
	s := &Server{Socket: socket, containers: map[string]cri.Container{}}
	sockettest.ServeGRPC(tb, socket, func(srv *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(srv, s) })
	return s
}

// Add makes the runtime run a container.
func (s *Server) Add(c cri.Container) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.containers[c.ID] = c
}

// Remove makes the runtime forget a container.
func (s *Server) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.containers, id)
}

// Lists counts the ListContainers calls answered so far.
func (s *Server) Lists() int { return int(s.lists.Load()) }

// ListContainers answers as containerd does: the ID filter matches by
// prefix, the label selector exactly.
func (s *Server) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	s.lists.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &runtimeapi.ListContainersResponse{}
	f := req.GetFilter()
	for _, id := range slices.Sorted(maps.Keys(s.containers)) {
		c := s.containers[id]
		if f != nil && !strings.HasPrefix(id, f.GetId()) {
			continue
		}
		labels := map[string]string{
			"io.kubernetes.pod.uid": c.PodUID, "io.kubernetes.pod.name": c.PodName,
			"io.kubernetes.pod.namespace": c.PodNamespace, "io.kubernetes.container.name": c.Name,
		}
		match := true
		for k, v := range f.GetLabelSelector() {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		resp.Containers = append(resp.Containers, &runtimeapi.Container{
			Id: id, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name}, Labels: labels, State: runtimeapi.ContainerState_CONTAINER_RUNNING,
		})
	}
	return resp, nil
}
