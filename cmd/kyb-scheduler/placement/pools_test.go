package placement

import (
	"fmt"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// A GPU index is read from names and attributes a slice publishes; one
// beyond any node's GPUs is not a GPU of the driver's, and a set sized by
// it would let one slice take the scheduler's memory (gpu9000000000000000
// is a valid counter name).
func TestGPUIndicesBeyondAnyNodeAreNotGPUs(t *testing.T) {
	one := resourceapi.Counter{Value: resource.MustParse("1")}
	for _, tc := range []struct {
		name     string
		device   resourceapi.Device
		wantSize int
	}{
		{name: "counters", wantSize: 1, device: resourceapi.Device{Name: "g0", ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
			CounterSet: counterSet, Counters: map[string]resourceapi.Counter{"gpu1": one, "gpu67108864": one},
		}}}},
		{name: "gpuIndices", wantSize: 1, device: resourceapi.Device{Name: "g0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"gpuIndices": {StringValue: ptr.To("1,67108864")},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := parseDevice(&tc.device)
			if d.size != tc.wantSize || len(d.gpus) > 1 || d.gpus.bound() != 2 {
				t.Errorf("parsed %d GPUs in a set of %d words, bound %d: want GPU 1 alone", d.size, len(d.gpus), d.gpus.bound())
			}
		})
	}
}

// A node publishing more devices than the driver ever does (in its own
// pool, as the slice admission policy lets it up to its bound) is no node
// of ours to the score: its slices reach the allocator as published,
// unordered, and it scores as a node without our devices, while the
// allocator still allocates from it. One device fewer, at the driver's
// largest pool, it is ours.
func TestAPoolLargerThanTheDriverPublishesIsNotOurs(t *testing.T) {
	for _, tc := range []struct {
		devices int
		ours    bool
	}{{maxPoolDevices, true}, {maxPoolDevices + 1, false}} {
		t.Run(fmt.Sprintf("devices=%d", tc.devices), func(t *testing.T) {
			f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", threeProfiles})
			f.sim.AddNode("node-b", resourceslice.DriverResources{}, driver.Name)
			huge := repeatedGroups("node-b", tc.devices, 32)
			f.sim.AddSlices(huge...)
			f.nodes = append(f.nodes, "node-b")

			pod, claim := f.seatPod(class1x, 1)
			state := framework.NewCycleState()
			var handed []*resourceapi.ResourceSlice
			if _, st := f.plugin.PreFilter(f.ctx, state, pod, nil); !st.IsSuccess() {
				t.Fatal(st)
			}
			a, err := f.sim.AllocatorOrdered(f.ctx, func(s *structured.AllocatedState, all []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
				handed = cycleOrder(state).OrderDevices(f.ctx, s, all)
				return handed
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := cycleOrder(state).set.pool("node-b") != nil; got != tc.ours {
				t.Fatalf("node-b's pool of %d devices is ours: %v, want %v", tc.devices, got, tc.ours)
			}
			if !tc.ours {
				for _, s := range handed {
					if *s.Spec.NodeName == "node-b" && !slices.Contains(huge, s) {
						t.Fatalf("slice %s of node-b was reordered", s.Name)
					}
				}
			}
			r, err := f.sim.Try(f.ctx, a, claim, "node-b")
			if err != nil || r == nil {
				t.Fatalf("the allocator found no seat on node-b: %v", err)
			}
			scores, st := f.scoresIn(state, pod, []string{"node-a", "node-b"})
			if scores == nil {
				t.Fatal(st)
			}
			if !tc.ours && (scores["node-b"] != 0 || scores["node-a"] != 100) {
				t.Errorf("scored %v: node-b publishes no pool of ours", scores)
			}
		})
	}
}

// The score reads a pool as the allocator does: its newest generation,
// once all resourceSliceCount of its slices are listed. While node-a's
// second pool is republished, neither its incomplete newest generation
// nor its older one gives a device: with the first pool's GPUs all taken
// the allocator finds no seat, and the score predicts none. Once the
// newest generation is complete, its devices (not the older ones') are
// the ones the allocator takes and the score predicts. A generation whose
// slices disagree on the count, which no driver publishes, gives the
// score no device.
func TestTheScoreReadsTheNewestCompleteGeneration(t *testing.T) {
	for _, tc := range []struct {
		name string
		// second: node-a-1's slices, from the two of a generation as
		// published (counters, devices).
		second func(published []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice
		want   []string
		// listingDecides: the allocator takes the count from the
		// generation's first slice in its listing, a lister's map order,
		// so that it may or may not find a seat from one cycle to the
		// next; the score takes none.
		listingDecides bool
	}{
		// Two of three slices listed: a third on its way.
		{name: "the newest generation incomplete, the older one listed", second: func(p []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			return []*resourceapi.ResourceSlice{p[0], p[1], generation(p[0], 2, 3), generation(p[1], 2, 3)}
		}},
		{name: "the newest generation incomplete alone", second: func(p []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			return []*resourceapi.ResourceSlice{generation(p[0], 2, 3), generation(p[1], 2, 3)}
		}},
		{name: "slices of a generation disagreeing on the count", second: func(p []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			return []*resourceapi.ResourceSlice{generation(p[0], 2, 2), generation(p[1], 2, 3)}
		}, listingDecides: true},
		{name: "the newest generation complete, the older one listed", second: func(p []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			return []*resourceapi.ResourceSlice{p[0], p[1], generation(p[0], 2, 2), renamed(generation(p[1], 2, 2), "g0-1x", "g0-1x-new")}
		}, want: []string{"node-a-1/g0-1x-new"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", threeProfiles})
			f.republish(nodeSpec{"node-a", "dgx-h100", threeProfiles}, "node-a", "node-a-1")
			var first, second []*resourceapi.ResourceSlice
			for _, s := range f.sim.Slices() {
				if s.Spec.Pool.Name == "node-a-1" {
					second = append(second, s)
				} else {
					first = append(first, s)
				}
			}
			if len(second) != 2 || len(second[0].Spec.SharedCounters) == 0 {
				t.Fatalf("node-a-1 published %d slices, want the counters' and the devices'", len(second))
			}
			f.sim.SetNode("node-a", resourceslice.DriverResources{}, driver.Name)
			f.sim.AddSlices(first...)
			f.sim.AddSlices(tc.second(second)...)
			// Pool node-a's GPUs all taken: a seat is node-a-1's or none.
			for range 2 {
				_, quad := f.seatPod(class4x, 1)
				if r := f.allocate(quad, "node-a", true); r.Devices.Results[0].Pool != "node-a" {
					t.Fatalf("a 4x seat took %s/%s, want a group of pool node-a", r.Devices.Results[0].Pool, r.Devices.Results[0].Device)
				}
			}
			pod, claim := f.seatPod(class1x, 1)
			if tc.want != nil {
				f.takenAndPredicted(pod, claim, "node-a", tc.want...)
				return
			}
			state := framework.NewCycleState()
			a := f.cycleAllocator(state, pod)
			if r, err := f.sim.Try(f.ctx, a, claim, "node-a"); err != nil || (r != nil && !tc.listingDecides) {
				t.Fatalf("the allocator took %v (%v), want no seat", r, err)
			}
			if got := f.predictedDevices(state, "node-a"); len(got) > 0 {
				t.Errorf("the score predicts %v on node-a, of no complete generation of node-a-1", got)
			}
		})
	}
}

// generation is a copy of s as generation number of a pool of count
// slices.
func generation(s *resourceapi.ResourceSlice, number, count int64) *resourceapi.ResourceSlice {
	c := s.DeepCopy()
	c.Name = fmt.Sprintf("%s-gen%d", s.Name, number)
	c.Spec.Pool.Generation, c.Spec.Pool.ResourceSliceCount = number, count
	return c
}

// renamed is s with its device from renamed to.
func renamed(s *resourceapi.ResourceSlice, from, to string) *resourceapi.ResourceSlice {
	for i := range s.Spec.Devices {
		if s.Spec.Devices[i].Name == from {
			s.Spec.Devices[i].Name = to
		}
	}
	return s
}
