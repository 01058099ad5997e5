package draresources_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// fourSlices is a NodeTopology of two MIG GPUs no table knows, four memory
// slices each.
const fourSlices = "testdata/mig-4-slices.yaml"

const fourSlicesConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/mig-1g.24gb, mig: {profile: 1g.24gb}}
- {resource: kyb.ai/mig-2g.48gb, mig: {profile: 2g.48gb}}
- {resource: kyb.ai/mig-4g.96gb, mig: {profile: 4g.96gb}, gpus: [1]}
`

// A MIG GPU that no table knows publishes its MIG seats from the geometry
// NVML gives: one device per profile and placement over its four memory
// slices, and the real allocator keeps them apart and off its whole-GPU
// groups as on an H100.
func TestMIGGPUNoTableKnowsPublishesItsSeats(t *testing.T) {
	n := newNode(t, fourSlices, fourSlicesConfig, draresources.LayoutShared)
	res := draresources.Resources(n.plan, n.inv, "node-1", draresources.LayoutShared)
	var mig []string
	counters := map[string]int64{}
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			if _, ok := d.Attributes[draresources.AttrMIGProfile]; ok {
				mig = append(mig, d.Name)
			}
		}
		for _, cs := range s.SharedCounters {
			for name, c := range cs.Counters {
				counters[name] = c.Value.Value()
			}
		}
	}
	slices.Sort(mig)
	want := "g0-mig-1g-24gb-0 g0-mig-1g-24gb-1 g0-mig-1g-24gb-2 g0-mig-1g-24gb-3 g0-mig-2g-48gb-0 g0-mig-2g-48gb-2 " +
		"g1-mig-1g-24gb-0 g1-mig-1g-24gb-1 g1-mig-1g-24gb-2 g1-mig-1g-24gb-3 g1-mig-2g-48gb-0 g1-mig-2g-48gb-2 g1-mig-4g-96gb-0"
	if got := strings.Join(mig, " "); got != want {
		t.Errorf("MIG devices:\n%s\nwant:\n%s", got, want)
	}
	for name, v := range map[string]int64{"gpu0": 4, "gpu1": 4, "gpu0-slice3": 1, "gpu1-slice0": 1} {
		if counters[name] != v {
			t.Errorf("counter %s = %d, want %d", name, counters[name], v)
		}
	}
	if _, ok := counters["gpu0-slice4"]; ok {
		t.Error("counter gpu0-slice4 on a GPU of four memory slices")
	}

	const class1g, class4g = "mig-1g.24gb.kyb.ai", "mig-4g.96gb.kyb.ai"
	if got := n.fill(t, class1g); len(got) != 8 {
		t.Errorf("%d 1g.24gb seats fit, want 4 per GPU: %v", len(got), got)
	}
	n = newNode(t, fourSlices, fourSlicesConfig, draresources.LayoutShared)
	if r := n.allocate(t, "small", class1g, onGPUs("1")); r == nil {
		t.Fatal("a 1g.24gb seat on GPU 1 does not fit on an empty node")
	}
	if r := n.allocate(t, "big", class4g); r != nil {
		t.Errorf("4g.96gb fit beside a 1g.24gb on its GPU: %+v", r.Devices.Results)
	}
	if r := n.allocate(t, "pair", class2x); r != nil {
		t.Errorf("the 2x group fit beside a MIG seat on one of its GPUs: %+v", r.Devices.Results)
	}
	if r := n.allocate(t, "one", class1x, onGPUs("0")); r == nil {
		t.Error("GPU 0's 1x group must fit: the MIG seat is on GPU 1")
	}
	// The 1g.24gb seat took slice 3 of GPU 1 (placements are tried from
	// the last slice down): a 2g.48gb over slices 2-3 of GPU 1 does not
	// fit, one over slices 0-1 does.
	const class2g = "mig-2g.48gb.kyb.ai"
	if r := n.allocate(t, "two-high", class2g, onGPUs("1"), atPlacement(2)); r != nil {
		t.Errorf("2g.48gb at {2}:2 fit over the 1g.24gb at {3}:1: %+v", r.Devices.Results)
	}
	if r := n.allocate(t, "two-low", class2g, onGPUs("1"), atPlacement(0)); r == nil {
		t.Error("2g.48gb at {0}:2 of GPU 1 must fit beside the 1g.24gb at {3}:1")
	}
}
