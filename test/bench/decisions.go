package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// The patched allocator (test/allocpatch) must make the decisions the
// stock one makes. Decisions plays random clusters and random pods through
// the allocator as kube-scheduler does (an allocator per pod, Allocate on
// every node, the first node that fits takes the pod, pods leave at
// random) and writes every node's answer for every pod, one line each. A
// build with the stock module and one with the patched module must write
// the same lines for the same seed.

// partDriver publishes generic partitionable devices: counters of several
// sizes, devices consuming some of them, some devices shared with a
// consumable capacity, some both.
const partDriver = "part.example.com"

// DecisionStats says what a Decisions run exercised, so that a run that
// proves little is noticed.
type DecisionStats struct {
	Pods, Placed, Refused, Errors, Releases int
	// SkippedBeforeSelectors is how often the allocator logged skipping a
	// device before its selectors, PoolsSkippedBeforeSelectors a whole
	// pool: never for the stock module.
	SkippedBeforeSelectors, PoolsSkippedBeforeSelectors int64
}

// Decisions writes the allocator's answers for streams random streams of
// steps pods each, from seed.
func Decisions(ctx context.Context, w io.Writer, seed uint64, streams, steps int) (DecisionStats, error) {
	var st DecisionStats
	sink := &skipCounter{}
	ctx = klog.NewContext(ctx, logr.New(sink))
	for s := 0; s < streams; s++ {
		rng := rand.New(rand.NewPCG(seed, uint64(s)))
		if err := decisionStream(ctx, w, rng, s, steps, &st); err != nil {
			return st, fmt.Errorf("stream %d: %w", s, err)
		}
	}
	st.SkippedBeforeSelectors = sink.skipped.Load()
	st.PoolsSkippedBeforeSelectors = sink.pools.Load()
	return st, nil
}

type placedPod struct {
	results []resourceapi.AllocationResult
}

func decisionStream(ctx context.Context, w io.Writer, rng *rand.Rand, stream, steps int, st *DecisionStats) error {
	c := schedulertest.New(schedulertest.SchedulerFeatures())
	kinds := []func(node string) (resourceslice.DriverResources, string, []*resourceapi.DeviceClass, error){
		kybNode(ctx, ""), kybNode(ctx, DemoConfig), kybNode(ctx, overprovisionConfig), partNode(rng), basicNode,
	}
	// Every class exists whatever nodes the cluster has: a claim for a
	// class no node serves is refused, not an error.
	for _, kind := range kinds {
		_, _, classes, err := kind("n")
		if err != nil {
			return err
		}
		c.AddClasses(classes...)
	}
	var nodes []string
	for i := range 2 + rng.IntN(4) {
		node := fmt.Sprintf("n%d", i)
		res, drv, _, err := kinds[rng.IntN(len(kinds))](node)
		if err != nil {
			return err
		}
		c.AddNode(node, res, drv)
		nodes = append(nodes, node)
	}
	var placed []placedPod
	for step := range steps {
		if len(placed) > 0 && rng.IntN(4) == 0 {
			k := rng.IntN(len(placed))
			for i := range placed[k].results {
				c.Release(&placed[k].results[i])
			}
			placed = slices.Delete(placed, k, k+1)
			st.Releases++
			fmt.Fprintf(w, "%d/%d release\n", stream, step)
			continue
		}
		claims := []*resourceapi.ResourceClaim{randomClaim(rng, fmt.Sprintf("s%d-p%d-a", stream, step))}
		if rng.IntN(5) == 0 {
			claims = append(claims, randomClaim(rng, fmt.Sprintf("s%d-p%d-b", stream, step)))
		}
		st.Pods++
		a, err := c.Allocator(ctx)
		if err != nil {
			return err
		}
		var chosen []resourceapi.AllocationResult
		for _, node := range nodes {
			results, err := a.Allocate(ctx, c.Node(node), claims)
			switch {
			case err != nil:
				st.Errors++
				fmt.Fprintf(w, "%d/%d %s error: %v\n", stream, step, node, err)
			case len(results) == 0:
				fmt.Fprintf(w, "%d/%d %s -\n", stream, step, node)
			default:
				fmt.Fprintf(w, "%d/%d %s %s\n", stream, step, node, describe(results))
				if chosen == nil {
					chosen = results
				}
			}
		}
		if chosen == nil {
			st.Refused++
			continue
		}
		st.Placed++
		for i := range chosen {
			c.Record(&chosen[i])
		}
		placed = append(placed, placedPod{results: chosen})
	}
	return nil
}

// describe is an allocation without its share IDs, which are random.
func describe(results []resourceapi.AllocationResult) string {
	var parts []string
	for _, r := range results {
		for _, d := range r.Devices.Results {
			s := fmt.Sprintf("%s=%s/%s", d.Request, d.Pool, d.Device)
			if d.ShareID != nil {
				s += "+share"
			}
			if ptr.Deref(d.AdminAccess, false) {
				s += "+admin"
			}
			var caps []string
			for name, q := range d.ConsumedCapacity {
				caps = append(caps, fmt.Sprintf("%s:%s", name, q.String()))
			}
			sort.Strings(caps)
			if len(caps) > 0 {
				s += "(" + strings.Join(caps, ",") + ")"
			}
			parts = append(parts, s)
		}
		parts = append(parts, "|")
	}
	return strings.Join(parts, " ")
}

const overprovisionConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, allowOverprovision: true}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 2}
- {resource: kyb.ai/gpu-4x-seat}
`

func kybNode(ctx context.Context, config string) func(string) (resourceslice.DriverResources, string, []*resourceapi.DeviceClass, error) {
	return func(node string) (resourceslice.DriverResources, string, []*resourceapi.DeviceClass, error) {
		s, err := KybShape(ctx, "decisions", "dgx-h100", config, "1x")
		if err != nil {
			return resourceslice.DriverResources{}, "", nil, err
		}
		return s.Resources(node), s.Driver, s.Classes, nil
	}
}

func basicNode(node string) (resourceslice.DriverResources, string, []*resourceapi.DeviceClass, error) {
	s := BasicShape()
	return s.Resources(node), s.Driver, s.Classes, nil
}

// partNode is a node of generic partitionable devices: one counter set of
// four counters of random sizes, eight devices each consuming a random
// part of them, some shared with a "memory" capacity.
func partNode(rng *rand.Rand) func(string) (resourceslice.DriverResources, string, []*resourceapi.DeviceClass, error) {
	return func(node string) (resourceslice.DriverResources, string, []*resourceapi.DeviceClass, error) {
		q := func(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }
		counters := map[string]resourceapi.Counter{}
		for i := range 4 {
			counters[fmt.Sprintf("c%d", i)] = resourceapi.Counter{Value: q(1 + rng.Int64N(3))}
		}
		var devices []resourceapi.Device
		for i := range 8 {
			d := resourceapi.Device{
				Name: fmt.Sprintf("d%d", i),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"kind": {StringValue: ptr.To([]string{"a", "b"}[rng.IntN(2)])},
					"numa": {IntValue: ptr.To(int64(rng.IntN(2)))},
				},
			}
			if rng.IntN(4) != 0 {
				use := map[string]resourceapi.Counter{}
				for j := range 4 {
					if rng.IntN(2) == 0 {
						use[fmt.Sprintf("c%d", j)] = resourceapi.Counter{Value: q(1 + rng.Int64N(2))}
					}
				}
				if len(use) > 0 {
					d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "chips", Counters: use}}
				}
			}
			if rng.IntN(3) == 0 {
				d.AllowMultipleAllocations = ptr.To(true)
				one := q(1)
				d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {
					Value:         q(2 + rng.Int64N(3)),
					RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: &one, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &one, Step: &one}},
				}}
			}
			devices = append(devices, d)
		}
		class := &resourceapi.DeviceClass{}
		class.Name = "part-class"
		class.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + partDriver + `"`}}}
		res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{
			{SharedCounters: []resourceapi.CounterSet{{Name: "chips", Counters: counters}}},
			{Devices: devices},
		}}}}
		return res, partDriver, []*resourceapi.DeviceClass{class}, nil
	}
}

// randomClaim is a claim of one or two requests of the classes above, with
// or without selectors, counts, capacities, constraints, alternatives and
// admin access.
func randomClaim(rng *rand.Rand, name string) *resourceapi.ResourceClaim {
	classes := []string{"gpu-1x-seat.kyb.ai", "gpu-2x-seat.kyb.ai", "gpu-4x-seat.kyb.ai", "part-class", "test-class"}
	request := func(name string) resourceapi.DeviceRequest {
		class := classes[rng.IntN(len(classes))]
		r := schedulertest.Claim("x", class, 1+int64(rng.IntN(3)/2)).Spec.Devices.Requests[0]
		r.Name = name
		e := r.Exactly
		switch {
		case class == "part-class" && rng.IntN(2) == 0:
			schedulertest.WithSelector(`device.attributes["` + partDriver + `"].kind == "a"`)(&r)
		case strings.HasSuffix(class, ".kyb.ai") && rng.IntN(3) == 0:
			schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices != "0"`)(&r)
		}
		switch {
		case class == "part-class" && rng.IntN(2) == 0:
			schedulertest.WithCapacity("memory", fmt.Sprint(1+rng.IntN(2)))(&r)
		case strings.HasSuffix(class, ".kyb.ai") && rng.IntN(4) == 0:
			schedulertest.WithCapacity(string(draresources.SeatsCapacity), fmt.Sprint(1+rng.IntN(2)))(&r)
		}
		if rng.IntN(20) == 0 {
			e.AllocationMode, e.Count = resourceapi.DeviceAllocationModeAll, 0
		}
		if rng.IntN(25) == 0 {
			e.AdminAccess = ptr.To(true)
		}
		if rng.IntN(6) == 0 {
			// An alternative: this request, else one device of a 1x seat.
			return resourceapi.DeviceRequest{Name: name, FirstAvailable: []resourceapi.DeviceSubRequest{
				{Name: "first", DeviceClassName: e.DeviceClassName, Selectors: e.Selectors, AllocationMode: e.AllocationMode, Count: e.Count, Capacity: e.Capacity},
				{Name: "else", DeviceClassName: "gpu-1x-seat.kyb.ai", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
			}}
		}
		return r
	}
	claim := schedulertest.Claim(name, classes[0], 1)
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{request("r0")}
	if rng.IntN(3) == 0 {
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, request("r1"))
		if rng.IntN(2) == 0 {
			claim.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{
				Requests:       []string{"r0", "r1"},
				MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.kyb.ai/interconnect")),
			}}
		}
	}
	return claim
}

// skipCounter is a logger that counts the patched allocator's "skipped
// before selectors" messages, of devices and of pools, and drops
// everything else.
type skipCounter struct{ skipped, pools atomic.Int64 }

func (s *skipCounter) Init(logr.RuntimeInfo)  {}
func (s *skipCounter) Enabled(level int) bool { return true }
func (s *skipCounter) Info(_ int, msg string, _ ...any) {
	switch {
	case strings.Contains(msg, "pool skipped before selectors"):
		s.pools.Add(1)
	case strings.Contains(msg, "skipped before selectors"):
		s.skipped.Add(1)
	}
}
func (s *skipCounter) Error(error, string, ...any)    {}
func (s *skipCounter) WithValues(...any) logr.LogSink { return s }
func (s *skipCounter) WithName(string) logr.LogSink   { return s }
