package bench

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// These measurements drive the scheduler's own allocator
// (k8s.io/dynamic-resource-allocation/structured, kube-scheduler 1.37's
// default features) the way kube-scheduler does: one allocator per claim
// (PreFilter), then Allocate once per node (Filter).

// cluster builds n nodes of a shape.
func cluster(s Shape, n int) *schedulertest.Cluster {
	c := schedulertest.New(schedulertest.SchedulerFeatures())
	for i := 0; i < n; i++ {
		node := nodeName(i)
		c.AddNode(node, s.Resources(node), s.Driver)
	}
	c.AddClasses(s.Classes...)
	return c
}

func nodeName(i int) string { return fmt.Sprintf("node-%03d", i) }

// holdings are the seats allocated per node and device, for shapes that
// publish again when they change (Shape.Republish).
type holdings map[string]draresources.Held

// note records what r allocated on node and, if the shape hides what its
// allocations block, publishes the node again. It returns how long the
// publish took: the plugin's and the API server's work, not the
// allocator's, so the timed runs leave it out.
func (h holdings) note(s Shape, c *schedulertest.Cluster, node string, r *resourceapi.AllocationResult) time.Duration {
	if s.Republish == nil || r == nil {
		return 0
	}
	start := time.Now()
	if h[node] == nil {
		h[node] = draresources.Held{}
	}
	for _, res := range r.Devices.Results {
		if res.Driver == s.Driver {
			h[node][res.Device]++
		}
	}
	c.SetNode(node, s.Republish(node, h[node]), s.Driver)
	return time.Since(start)
}

// fillNode allocates one-device claims of the shape's class on node until
// one does not fit, checks that exactly PerNode fit, and returns their
// allocations.
func fillNode(ctx context.Context, s Shape, c *schedulertest.Cluster, node string, next *int) ([]*resourceapi.AllocationResult, error) {
	held := holdings{}
	var out []*resourceapi.AllocationResult
	for k := 0; ; k++ {
		*next++
		r, err := c.Allocate(ctx, schedulertest.Claim(fmt.Sprintf("fill-%d", *next), s.Class, 1), node)
		if err != nil {
			return nil, fmt.Errorf("shape %s: fill %s: %w", s.Name, node, err)
		}
		held.note(s, c, node, r)
		if r == nil {
			if k != s.PerNode {
				return nil, fmt.Errorf("shape %s: %d claims fit on %s, want %d", s.Name, k, node, s.PerNode)
			}
			return out, nil
		}
		out = append(out, r)
	}
}

// fillAs records on node the allocations fillNode made on first: the
// nodes of a shape are alike, each its own pool named after it, so that
// a full node's allocations are the first's in its pool. Filling 500
// nodes one allocation at a time costs minutes where a node holds 64
// shares, and the allocator's state ends the same.
func fillAs(c *schedulertest.Cluster, node, first string, allocs []*resourceapi.AllocationResult) {
	for _, r := range allocs {
		r = r.DeepCopy()
		for i := range r.Devices.Results {
			if r.Devices.Results[i].Pool == first {
				r.Devices.Results[i].Pool = node
			}
		}
		c.Record(r)
	}
}

// RejectFull is how long Allocate takes to find that a claim does not fit
// on a full node: the common Filter outcome in a busy cluster. nodes full
// nodes are each tried once per allocator (as the scheduler does for one
// pod), reps times with fresh allocators; it returns the mean per node.
func RejectFull(ctx context.Context, s Shape, nodes, reps int) (time.Duration, error) {
	c := cluster(s, nodes)
	next := 0
	first, err := fillNode(ctx, s, c, nodeName(0), &next)
	if err != nil {
		return 0, err
	}
	for i := 1; i < nodes; i++ {
		// A shape that publishes again as seats are held fills each
		// node through the allocator, publishing as it goes.
		if s.Republish != nil {
			if _, err := fillNode(ctx, s, c, nodeName(i), &next); err != nil {
				return 0, err
			}
			continue
		}
		fillAs(c, nodeName(i), nodeName(0), first)
	}
	return timeRejects(ctx, s, c, nodes, reps)
}

// minRejectTime is how long each reject measurement runs at least: the
// basic shape rejects a node in microseconds, and a short run is all noise.
const minRejectTime = 300 * time.Millisecond

func timeRejects(ctx context.Context, s Shape, c *schedulertest.Cluster, nodes, reps int) (time.Duration, error) {
	claim := schedulertest.Claim("probe", s.Class, 1, s.Probe...)
	var total time.Duration
	r := 0
	for ; r < reps || total < minRejectTime; r++ {
		a, err := c.Allocator(ctx)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		for i := 0; i < nodes; i++ {
			res, err := c.AllocateWith(ctx, a, claim, nodeName(i))
			if err != nil {
				return 0, fmt.Errorf("shape %s: %w", s.Name, err)
			}
			if res != nil {
				return 0, fmt.Errorf("shape %s: a claim fit on full node %s", s.Name, nodeName(i))
			}
		}
		total += time.Since(start)
	}
	return total / time.Duration(nodes*r), nil
}

// RejectEmpty is RejectFull for a shape whose nodes hold no claim of its
// class at all (PerNode 0): a node that publishes only what a full node
// could not skip.
func RejectEmpty(ctx context.Context, s Shape, nodes, reps int) (time.Duration, error) {
	return timeRejects(ctx, s, cluster(s, nodes), nodes, reps)
}

// FirstFit is M2 of allocator-cost.md: for each of claims one-device
// claims, a fresh allocator, then Allocate on node-000, node-001, … until
// the claim fits. It returns claims per second and the Allocate calls made.
func FirstFit(ctx context.Context, s Shape, nodes, claims int) (FirstFitResult, error) {
	c := cluster(s, nodes)
	res := FirstFitResult{Claims: claims}
	held := holdings{}
	var publishing time.Duration
	start := time.Now()
	for k := 0; k < claims; k++ {
		claim := schedulertest.Claim(fmt.Sprintf("ff-%d", k), s.Class, 1, s.Probe...)
		a, err := c.Allocator(ctx)
		if err != nil {
			return res, err
		}
		placed := false
		for i := 0; i < nodes && !placed; i++ {
			res.Calls++
			r, err := c.AllocateWith(ctx, a, claim, nodeName(i))
			if err != nil {
				return res, fmt.Errorf("shape %s: %w", s.Name, err)
			}
			placed = r != nil
			publishing += held.note(s, c, nodeName(i), r)
		}
		if !placed {
			return res, fmt.Errorf("shape %s: claim %d fits nowhere on %d nodes", s.Name, k, nodes)
		}
	}
	res.Elapsed = time.Since(start) - publishing
	return res, nil
}

// FirstFitResult is one FirstFit run.
type FirstFitResult struct {
	Claims  int
	Calls   int
	Elapsed time.Duration
}

// ClaimsPerSecond is the allocation throughput.
func (r FirstFitResult) ClaimsPerSecond() float64 { return float64(r.Claims) / r.Elapsed.Seconds() }

// PerCall is the mean time of one Allocate call.
func (r FirstFitResult) PerCall() time.Duration { return r.Elapsed / time.Duration(max(r.Calls, 1)) }
