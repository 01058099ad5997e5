// Package podresourcestest serves the kubelet's PodResources API (v1 List
// and Get) over a real unix socket, from pods a test sets: what the kubelet
// would answer. It is for tests only; no binary links it
// (hack/deps-check.sh).
package podresourcestest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// Server is a PodResources API with the pods a test set.
type Server struct {
	// Socket is where it listens.
	Socket string

	podresourcesapi.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	pods map[types.NamespacedName][]podresources.ContainerClaims
	gets atomic.Int64
	// limiter, when set, refuses calls over its rate as the kubelet's
	// server does.
	limiter *rate.Limiter
	// whole are the pods set as the API's own type (SetPodResources).
	whole map[types.NamespacedName]*podresourcesapi.PodResources
}

// TB is what Start needs of a test (testing.TB, or a harness's).
type TB = sockettest.TB

// Start serves the API at socket until the test ends.
func Start(tb TB, socket string) *Server {
	tb.Helper()
	s := &Server{Socket: socket, pods: map[types.NamespacedName][]podresources.ContainerClaims{}, whole: map[types.NamespacedName]*podresourcesapi.PodResources{}}
	sockettest.ServeGRPC(tb, socket, func(srv *grpc.Server) { podresourcesapi.RegisterPodResourcesListerServer(srv, s) })
	return s
}

// SetPod makes the kubelet know a pod whose containers reference claims.
func (s *Server) SetPod(namespace, name string, containers ...podresources.ContainerClaims) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := types.NamespacedName{Namespace: namespace, Name: name}
	s.pods[key] = containers
	delete(s.whole, key)
}

// SetPodResources makes the kubelet know a pod whose containers hold what
// p says (device-plugin devices, claims with the devices drivers prepared
// for them), answered as it is; p is not changed afterwards.
func (s *Server) SetPodResources(p *podresourcesapi.PodResources) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := types.NamespacedName{Namespace: p.GetNamespace(), Name: p.GetName()}
	s.pods[key] = nil
	s.whole[key] = p
}

// RemovePod makes the kubelet forget a pod.
func (s *Server) RemovePod(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := types.NamespacedName{Namespace: namespace, Name: name}
	delete(s.pods, key)
	delete(s.whole, key)
}

// Limit refuses calls over limiter's rate from now on, as the kubelet
// does (its server interceptor: ResourceExhausted, "rejected by rate
// limit").
func (s *Server) Limit(limiter *rate.Limiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limiter = limiter
}

// allow applies the rate limit. Call with s.mu held.
func (s *Server) allow() error {
	if s.limiter != nil && !s.limiter.Allow() {
		return status.Error(codes.ResourceExhausted, "rejected by rate limit")
	}
	return nil
}

// Gets counts the Get calls answered so far.
func (s *Server) Gets() int { return int(s.gets.Load()) }

func (s *Server) resources(key types.NamespacedName) *podresourcesapi.PodResources {
	if p, ok := s.whole[key]; ok {
		return p
	}
	p := &podresourcesapi.PodResources{Namespace: key.Namespace, Name: key.Name}
	for _, c := range s.pods[key] {
		ctr := &podresourcesapi.ContainerResources{Name: c.Name}
		for _, claim := range c.Claims {
			ctr.DynamicResources = append(ctr.DynamicResources, &podresourcesapi.DynamicResource{ClaimName: claim.Name, ClaimNamespace: claim.Namespace})
		}
		p.Containers = append(p.Containers, ctr)
	}
	return p
}

// Get answers as the kubelet does: an error for a pod it does not know.
func (s *Server) Get(_ context.Context, req *podresourcesapi.GetPodResourcesRequest) (*podresourcesapi.GetPodResourcesResponse, error) {
	s.gets.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allow(); err != nil {
		return nil, err
	}
	key := types.NamespacedName{Namespace: req.GetPodNamespace(), Name: req.GetPodName()}
	if _, ok := s.pods[key]; !ok {
		return nil, fmt.Errorf("pod %s in namespace %s not found", key.Name, key.Namespace)
	}
	return &podresourcesapi.GetPodResourcesResponse{PodResources: s.resources(key)}, nil
}

// List lists every pod set.
func (s *Server) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allow(); err != nil {
		return nil, err
	}
	resp := &podresourcesapi.ListPodResourcesResponse{}
	for _, key := range slices.SortedFunc(maps.Keys(s.pods), func(a, b types.NamespacedName) int {
		return strings.Compare(a.String(), b.String())
	}) {
		resp.PodResources = append(resp.PodResources, s.resources(key))
	}
	return resp, nil
}
