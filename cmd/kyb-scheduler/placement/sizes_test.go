package placement

import (
	"maps"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// sizedGroups are sized groups of one GPU (8 seats) and of two (4), and
// four-GPU groups of one seat, all over the node's GPUs.
const sizedGroups = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 4
  sharing: {strategy: mps, sized: true}
- {resource: kyb.ai/gpu-4x-seat}
`

const (
	classSized   = "gpu-1x-sized.kyb.ai"
	classSized2x = "gpu-2x-sized.kyb.ai"
)

// sized asks memory and compute ("" leaves one out).
func sized(memory, compute string) func(*resourceapi.DeviceRequest) {
	return func(r *resourceapi.DeviceRequest) {
		if memory != "" {
			schedulertest.WithCapacity(string(draresources.MemoryCapacity), memory)(r)
		}
		if compute != "" {
			schedulertest.WithCapacity(string(draresources.ComputeCapacity), compute)(r)
		}
	}
}

// sizedSubRequests asks memory of every subrequest of a firstAvailable
// request.
func sizedSubRequests(memory string) func(*resourceapi.DeviceRequest) {
	return func(r *resourceapi.DeviceRequest) {
		for i := range r.FirstAvailable {
			r.FirstAvailable[i].Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				draresources.MemoryCapacity: resource.MustParse(memory),
			}}
		}
	}
}

// onGPU keeps a request to the group of the GPUs gpuIndices names.
func onGPU(gpuIndices string) func(*resourceapi.DeviceRequest) {
	return schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "` + gpuIndices + `"`)
}

// hold allocates a sized seat of memory on the 1x group of gpu on node,
// written to the API server.
func (f *fixture) hold(node, gpu, memory string) {
	f.t.Helper()
	_, claim := f.seatPod(classSized, 1, sized(memory, ""), onGPU(gpu))
	if r := f.allocate(claim, node, true); r.Devices.Results[0].Device != "g"+gpu+"-1x-sized" {
		f.t.Fatalf("the seat held on %s took %s, want g%s-1x-sized", node, r.Devices.Results[0].Device, gpu)
	}
}

// Under pack a sized seat goes where it leaves the least memory: within
// a node, the group in use with the least memory left that still fits
// it (the device order puts the groups in use by what they have left, and
// the allocator takes the first that fits: best fit); across nodes, the
// node where its group has the least left, before a fuller node where it
// would leave more. Joining a group in use still comes first: a node of
// larger GPUs whose group in use takes the seat ranks above a node whose
// group in use is too full for it, though the idle group taken there
// would have less left. The score predicts the group the allocator takes.
func TestPackLeavesTheLeastMemory(t *testing.T) {
	t.Run("the group within the node", func(t *testing.T) {
		f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", sizedGroups})
		// An H100 has 81559 MiB: 59.6 GiB left on g0, 29.6 on g1.
		f.hold("node-a", "0", "20Gi")
		f.hold("node-a", "1", "50Gi")
		pod, claim := f.seatPod(classSized, 1, sized("25Gi", ""))
		f.takenAndPredicted(pod, claim, "node-a", "node-a/g1-1x-sized")
		// 30Gi fits g1 no more: the group with the next least left.
		pod, claim = f.seatPod(classSized, 1, sized("30Gi", "20"))
		f.takenAndPredicted(pod, claim, "node-a", "node-a/g0-1x-sized")
	})
	t.Run("the node", func(t *testing.T) {
		f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", sizedGroups}, nodeSpec{"node-b", "dgx-h100", sizedGroups})
		// node-a: 29.6 GiB left on g1. node-b, fuller: 59.6 on g0, 9.6
		// on g1.
		f.hold("node-a", "1", "50Gi")
		f.hold("node-b", "0", "20Gi")
		f.hold("node-b", "1", "70Gi")
		pod, claim := f.seatPod(classSized, 1, sized("25Gi", ""))
		state, a := f.takenAndPredicted(pod, claim, "node-a", "node-a/g1-1x-sized")
		if r := f.tryWith(a, claim, "node-b"); r == nil || allocatedDevices(r)[0] != "node-b/g0-1x-sized" {
			t.Fatalf("on node-b the allocator takes %v, want g0", r)
		}
		scores, st := f.scoresIn(state, pod, f.feasibleWith(a, claim))
		if want := map[string]int64{"node-a": 100, "node-b": 0}; !maps.Equal(scores, want) {
			t.Errorf("pack scored %v (%v), want %v: on node-a the seat leaves 4.6 GiB, on node-b 34.6", scores, st, want)
		}
	})
	t.Run("joining first", func(t *testing.T) {
		f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", sizedGroups}, nodeSpec{"node-c", "dgx-h200", sizedGroups})
		// node-a: 9.6 GiB left on g0; node-c (an H200, 140.4 GiB): 120.4.
		f.hold("node-a", "0", "70Gi")
		f.hold("node-c", "0", "20Gi")
		pod, claim := f.seatPod(classSized, 1, sized("30Gi", ""))
		state, a := f.takenAndPredicted(pod, claim, "node-c", "node-c/g0-1x-sized")
		scores, st := f.scoresIn(state, pod, f.feasibleWith(a, claim))
		if want := map[string]int64{"node-a": 0, "node-c": 100}; !maps.Equal(scores, want) {
			t.Errorf("pack scored %v (%v), want %v: on node-c the seat joins a group in use", scores, st, want)
		}
	})
}

// tryWith is what the allocator a allocates for claim on node, nil where
// it does not fit.
func (f *fixture) tryWith(a structured.Allocator, claim *resourceapi.ResourceClaim, node string) *resourceapi.AllocationResult {
	f.t.Helper()
	r, err := f.sim.Try(f.ctx, a, claim, node)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}
