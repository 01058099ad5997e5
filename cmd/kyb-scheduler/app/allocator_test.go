package app

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr/funcr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// TestAllocatorIsPatched: kyb-scheduler's allocator is the patched one
// (test/allocpatch): on a full node it refuses devices by their counters
// before it evaluates any selector, which the stock allocator never does
// (it logs each such device at V(7); test/bench counts the same lines
// over random clusters, TestPatchedAllocatorDecidesAsStock, and finds the
// decisions identical to stock).
func TestAllocatorIsPatched(t *testing.T) {
	var skipped atomic.Int64
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, "skipped before selectors") {
			skipped.Add(1)
		}
	}, funcr.Options{Verbosity: 7})
	ctx := klog.NewContext(context.Background(), logger)
	cluster, _, _ := seatNode(ctx, t)
	for i := range 8 {
		if r, err := cluster.Allocate(ctx, schedulertest.Claim(fmt.Sprintf("seat-%d", i), "gpu-1x-seat.kyb.ai", 1), "node-a"); err != nil || r == nil {
			t.Fatalf("seat %d: %v", i, err)
		}
	}
	skipped.Store(0)
	r, err := cluster.Allocate(ctx, schedulertest.Claim("pair", "gpu-2x-seat.kyb.ai", 1), "node-a")
	if err != nil || r != nil {
		t.Fatalf("a full node took a 2x seat: %v, %v", r, err)
	}
	if skipped.Load() == 0 {
		t.Error("the allocator evaluated the selectors of every device of a full node: kyb-scheduler was built against the stock allocator")
	}
}

// seatNode is a cluster of one dgx-h100 node, node-a, publishing 1x and
// 2x seats, with their classes; and the node's resources, and the classes
// by name.
func seatNode(ctx context.Context, t *testing.T) (*schedulertest.Cluster, func() resourceslice.DriverResources, map[string]*resourceapi.DeviceClass) {
	t.Helper()
	sim, err := simnode.Load("dgx-h100", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Discover(ctx, sim.NVML(), sim.PCIe())
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte("profiles:\n- {resource: kyb.ai/gpu-1x-seat}\n- {resource: kyb.ai/gpu-2x-seat}\n"), "test config")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	resources := func() resourceslice.DriverResources {
		return draresources.Resources(plan, inv, "node-a", draresources.LayoutShared)
	}
	cluster := schedulertest.New(schedulertest.SchedulerFeatures())
	cluster.AddNode("node-a", resources(), driver.Name)
	classes := map[string]*resourceapi.DeviceClass{}
	for _, dc := range draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{}) {
		cluster.AddClasses(dc)
		classes[dc.Name] = dc
	}
	return cluster, resources, classes
}

// TestAllocatorRemembersClassSelectors: kyb-scheduler's allocator
// evaluates a DeviceClass's selectors on a device once per version of the
// node's slices, not once per pod (test/allocpatch patch 7): the
// allocators of successive pods share what it found. A claim's own
// selectors, a changed class and republished slices are evaluated again.
func TestAllocatorRemembersClassSelectors(t *testing.T) {
	var classEvals, claimEvals atomic.Int64
	logger := funcr.New(func(_, args string) {
		if !strings.Contains(args, `"msg"="CEL result"`) {
			return
		}
		if strings.Contains(args, `"class"=`) {
			classEvals.Add(1)
		} else {
			claimEvals.Add(1)
		}
	}, funcr.Options{Verbosity: 7})
	ctx := klog.NewContext(context.Background(), logger)
	cluster, resources, classes := seatNode(ctx, t)
	const class = "gpu-1x-seat.kyb.ai"

	// try is a pod's Filter on node-a: a fresh allocator, as PreFilter
	// makes one per pod, and the claim tried, not recorded. It returns the
	// class's and the claim's evaluations.
	try := func(name string, claim *resourceapi.ResourceClaim, fits bool) (int64, int64) {
		t.Helper()
		classEvals.Store(0)
		claimEvals.Store(0)
		a, err := cluster.Allocator(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r, err := cluster.Try(ctx, a, claim, "node-a")
		if err != nil || (r != nil) != fits {
			t.Fatalf("%s: allocation %v, error %v; want one: %v", name, r, err, fits)
		}
		return classEvals.Load(), claimEvals.Load()
	}

	if c, _ := try("first pod", schedulertest.Claim("a", class, 1), true); c == 0 {
		t.Fatal("the first pod evaluated no class selector: the test sees no evaluation")
	}
	if c, _ := try("second pod", schedulertest.Claim("b", class, 1), true); c != 0 {
		t.Errorf("the second pod evaluated the class's selectors %d times on devices the first pod's allocator evaluated them on: "+
			"kyb-scheduler was built without test/allocpatch's patch 7", c)
	}
	for i := range 2 {
		pinned := schedulertest.Claim(fmt.Sprintf("pinned-%d", i), class, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "3"`))
		if _, own := try("a claim with a selector of its own", pinned, true); own == 0 {
			t.Errorf("pod %d: the claim's own selector was not evaluated: a claim's selectors are never remembered", i)
		}
	}

	// The class changed under its name: its new expression decides.
	changed := classes[class].DeepCopy()
	changed.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "other.example.com"`}}}
	changed.ResourceVersion = "2"
	cluster.AddClasses(changed)
	if c, _ := try("changed class", schedulertest.Claim("c", class, 1), false); c == 0 {
		t.Error("the changed class's expression was not evaluated")
	}

	// Republished slices make a new pool: evaluated again.
	cluster.AddClasses(classes[class])
	try("class restored", schedulertest.Claim("d", class, 1), true)
	cluster.SetNode("node-a", resources(), driver.Name)
	if c, _ := try("republished slices", schedulertest.Claim("e", class, 1), true); c == 0 {
		t.Error("the class's selectors were not evaluated on the republished slices")
	}
}
