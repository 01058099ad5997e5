package app

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr/funcr"
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
	cluster := schedulertest.New(schedulertest.SchedulerFeatures())
	cluster.AddNode("node-a", draresources.Resources(plan, inv, "node-a", draresources.LayoutShared), driver.Name)
	cluster.AddClasses(draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{})...)
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
