package draresources_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// These tests run the scheduler's own allocator over what an H100 node
// with MIG profiles publishes: every rule between MIG seats and
// whole-GPU groups is kept by counters alone.

const (
	class8x     = "gpu-8x-seat.kyb.ai"
	classMIG1g  = "mig-1g.10gb.kyb.ai"
	classMIG2g  = "mig-2g.20gb.kyb.ai"
	classMIG3g  = "mig-3g.40gb.kyb.ai"
	classMIG4g  = "mig-4g.40gb.kyb.ai"
	classMIG1me = "mig-1g.10gb-me.kyb.ai"
)

// migOnGPU0 is the 1x…8x profiles on an H100 node, and 1g.10gb on GPU 0.
const migOnGPU0 = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-4x-seat}
- {resource: kyb.ai/gpu-8x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}
`

func onGPUs(list string) func(*resourceapi.DeviceRequest) {
	return schedulertest.WithSelector(fmt.Sprintf(`device.attributes["gpu.kyb.ai"].gpuIndices == %q`, list))
}

func atPlacement(start int) func(*resourceapi.DeviceRequest) {
	return schedulertest.WithSelector(fmt.Sprintf(`device.attributes["gpu.kyb.ai"].placementStart == %d`, start))
}

func TestSevenMIGSeatsFitOnAnH100AndNoEighth(t *testing.T) {
	n := newNode(t, "dgx-h100", migOnGPU0, draresources.LayoutShared)
	got := n.fill(t, classMIG1g)
	want := []string{"g0-mig-1g-10gb-6", "g0-mig-1g-10gb-5", "g0-mig-1g-10gb-4", "g0-mig-1g-10gb-3", "g0-mig-1g-10gb-2", "g0-mig-1g-10gb-1", "g0-mig-1g-10gb-0"}
	if !slices.Equal(got, want) {
		t.Errorf("1g.10gb seats: %v, want %v and no eighth", got, want)
	}
}

func TestMIGSeatExcludesEveryGroupOfItsGPU(t *testing.T) {
	n := newNode(t, "dgx-h100", migOnGPU0, draresources.LayoutShared)
	if r := n.allocate(t, "mig", classMIG1g); r == nil {
		t.Fatal("a 1g.10gb seat does not fit on an empty node")
	}
	for _, c := range []struct{ class, gpus string }{{class1x, "0"}, {class2x, "0,1"}, {class4x, "0,1,2,3"}, {class8x, "0,1,2,3,4,5,6,7"}} {
		if r := n.allocate(t, "whole-"+c.class, c.class, onGPUs(c.gpus)); r != nil {
			t.Errorf("%s on GPUs %s fit beside a MIG seat on GPU 0: %+v", c.class, c.gpus, r.Devices.Results)
		}
	}
	for _, c := range []struct{ class, gpus string }{{class2x, "2,3"}, {class4x, "4,5,6,7"}, {class1x, "1"}} {
		if r := n.allocate(t, "other-"+c.class, c.class, onGPUs(c.gpus)); r == nil {
			t.Errorf("%s on GPUs %s must fit: GPU 0 is not one of them", c.class, c.gpus)
		}
	}
	// The MIG seats left on GPU 0 still fit.
	if got := n.fill(t, classMIG1g); len(got) != 6 {
		t.Errorf("%d more 1g.10gb seats fit, want 6: %v", len(got), got)
	}
}

func TestWholeGPUGroupExcludesMIGSeats(t *testing.T) {
	for _, c := range []struct{ class, gpus string }{{class1x, "0"}, {class2x, "0,1"}, {class8x, "0,1,2,3,4,5,6,7"}} {
		t.Run(c.class, func(t *testing.T) {
			n := newNode(t, "dgx-h100", migOnGPU0, draresources.LayoutShared)
			if r := n.allocate(t, "whole", c.class, onGPUs(c.gpus)); r == nil {
				t.Fatalf("%s on GPUs %s does not fit on an empty node", c.class, c.gpus)
			}
			if got := n.fill(t, classMIG1g); len(got) != 0 {
				t.Errorf("MIG seats %v fit on GPU 0 while %s holds it", got, c.class)
			}
		})
	}
}

// migPlacements is every multi-slice profile on GPU 0 of an H100.
const migPlacements = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-2g.20gb, mig: {profile: 2g.20gb}, gpus: [0]}
- {resource: kyb.ai/mig-3g.40gb, mig: {profile: 3g.40gb}, gpus: [0]}
- {resource: kyb.ai/mig-4g.40gb, mig: {profile: 4g.40gb}, gpus: [0]}
`

func TestMIGPlacementsThatOverlapExcludeEachOther(t *testing.T) {
	n := newNode(t, "dgx-h100", migPlacements, draresources.LayoutShared)
	three := n.allocate(t, "three", classMIG3g)
	four := n.allocate(t, "four", classMIG4g)
	if three == nil || four == nil {
		t.Fatalf("3g.40gb and 4g.40gb must coexist: %v %v", three, four)
	}
	if d3, d4 := three.Devices.Results[0].Device, four.Devices.Results[0].Device; d3 != "g0-mig-3g-40gb-4" || d4 != "g0-mig-4g-40gb-0" {
		t.Errorf("3g.40gb at %s, 4g.40gb at %s; want {4}:4 and {0}:4", d3, d4)
	}
	if r := n.allocate(t, "two", classMIG2g); r != nil {
		t.Errorf("a 2g.20gb fit on a GPU whose eight slices are taken: %+v", r.Devices.Results)
	}

	n = newNode(t, "dgx-h100", migPlacements, draresources.LayoutShared)
	if r := n.allocate(t, "four", classMIG4g); r == nil || r.Devices.Results[0].Device != "g0-mig-4g-40gb-0" {
		t.Fatalf("4g.40gb: %+v", r)
	}
	if r := n.allocate(t, "two-at-2", classMIG2g, atPlacement(2)); r != nil {
		t.Errorf("2g.20gb at {2}:2 fit inside 4g.40gb at {0}:4: %+v", r.Devices.Results)
	}
	if r := n.allocate(t, "two-at-4", classMIG2g, atPlacement(4)); r == nil {
		t.Error("2g.20gb at {4}:2 must fit beside 4g.40gb at {0}:4")
	}
	if r := n.allocate(t, "three", classMIG3g); r != nil {
		t.Errorf("3g.40gb fit with slices 0-5 taken: %+v", r.Devices.Results)
	}
}

func TestMIGSeatsPerGPUAndTheModelsMaximumAreCounted(t *testing.T) {
	n := newNode(t, "dgx-h100", `
profiles:
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 2}, gpus: [0]}
- {resource: kyb.ai/mig-1g.10gb-me, mig: {profile: 1g.10gb+me}, gpus: [1]}
`, draresources.LayoutShared)
	if got := n.fill(t, classMIG1g); len(got) != 2 {
		t.Errorf("1g.10gb with seatsPerGPU 2: %v fit", got)
	}
	if got := n.fill(t, classMIG1me); len(got) != 1 {
		t.Errorf("1g.10gb+me, one per H100: %v fit", got)
	}
}

func TestMIGExtendedResourceIsServedByDRA(t *testing.T) {
	n := newNode(t, "dgx-h100", migOnGPU0, draresources.LayoutShared)
	claim, err := n.cluster.ExtendedResourceClaim("legacy", "kyb.ai/mig-1g.10gb", 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := n.cluster.Allocate(ctx, claim, "node-1")
	if err != nil || r == nil {
		t.Fatalf("kyb.ai/mig-1g.10gb: 1 is not satisfiable: %v %v", r, err)
	}
	if d := r.Devices.Results[0].Device; !strings.HasPrefix(d, "g0-mig-1g-10gb-") {
		t.Errorf("got %s, want a 1g.10gb instance on GPU 0", d)
	}
}

func TestMIGDeviceAttributes(t *testing.T) {
	n := newNode(t, "dgx-h100", migOnGPU0, draresources.LayoutShared)
	var d *resourceapi.Device
	for _, s := range n.cluster.Slices() {
		for i := range s.Spec.Devices {
			if s.Spec.Devices[i].Name == "g0-mig-1g-10gb-3" {
				d = &s.Spec.Devices[i]
			}
		}
	}
	if d == nil {
		t.Fatal("no device g0-mig-1g-10gb-3")
	}
	str := map[string]string{"profile": "mig-1g-10gb", "group": "G0", "gpuIndices": "0", "interconnect": "none", "type": "mig", "migProfile": "1g.10gb", "parentUUID": n.inv.GPUs[0].UUID}
	ints := map[string]int64{"placementStart": 3, "placementSize": 1}
	if len(d.Attributes) != len(str)+len(ints) {
		t.Errorf("attributes %v", d.Attributes)
	}
	for k, v := range str {
		if got := d.Attributes[resourceapi.QualifiedName(k)].StringValue; got == nil || *got != v {
			t.Errorf("%s = %v, want %q", k, got, v)
		}
	}
	for k, v := range ints {
		if got := d.Attributes[resourceapi.QualifiedName(k)].IntValue; got == nil || *got != v {
			t.Errorf("%s = %v, want %d", k, got, v)
		}
	}
	seats := d.Capacity[draresources.SeatsCapacity].Value
	if d.AllowMultipleAllocations != nil || len(d.Capacity) != 1 || seats.String() != "1" {
		t.Errorf("a MIG seat is an ordinary device of one seat: %+v", d)
	}
}

func TestUnhealthyGPUTaintsItsMIGSeats(t *testing.T) {
	n := newNode(t, "dgx-h100", migOnGPU0, draresources.LayoutShared)
	res := draresources.Resources(n.plan, n.inv, "node-1", draresources.LayoutShared)
	draresources.Taint(res, n.plan, draresources.Faults{0: {Reason: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}})
	tainted := 0
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			if strings.HasPrefix(d.Name, "g0-mig-") {
				if len(d.Taints) != 1 || d.Taints[0].Value != "xid-79" {
					t.Errorf("%s: taints %v", d.Name, d.Taints)
				}
				tainted++
			}
		}
	}
	if tainted != 7 {
		t.Errorf("%d MIG devices of GPU 0 seen, want 7", tainted)
	}
}
