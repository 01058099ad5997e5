package seatview_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/fragmentation"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// threeProfiles is one seat per group of 1, 2 and 4 GPUs: on a dgx-h100,
// 1x groups 0..7, 2x 01 23 45 67, 4x 0123 4567.
const threeProfiles = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-4x-seat}
`

// newClusterOf is newCluster with a preset and a configuration of its own.
func newClusterOf(t *testing.T, preset, config string, layout draresources.Layout, nodes ...string) *cluster {
	c := &cluster{t: t, sched: schedulertest.New(schedulertest.SchedulerFeatures())}
	sn := simnodetest.New(t, preset, config)
	for _, name := range nodes {
		res := draresources.Resources(sn.Plan, sn.Inv, name, layout)
		c.sched.AddNode(name, res, driver.Name)
		for _, s := range draresources.ResourceSlices(res, name) {
			c.slices = append(c.slices, *s)
		}
	}
	c.sched.AddClasses(draresources.DeviceClasses(sn.Plan.Profiles, draresources.DeviceClassOptions{})...)
	return c
}

// onGPUs selects the group of exactly these GPUs.
func onGPUs(gpus string) string {
	return `device.attributes["gpu.kyb.ai"].gpuIndices == "` + gpus + `"`
}

func TestFragmentationOfEachNodeAndTheCluster(t *testing.T) {
	c := newClusterOf(t, "dgx-h100", threeProfiles, draresources.LayoutShared, "node-a", "node-b", "node-c")
	// node-a: GPUs 0 and 5 busy, both four-GPU groups broken.
	c.allocate("ns", "a0", "gpu-1x-seat.kyb.ai", onGPUs("0"), "node-a", "p", nil)
	c.allocate("ns", "a5", "gpu-1x-seat.kyb.ai", onGPUs("5"), "node-a", "p", nil)
	// node-b: a pair on GPUs 0 and 1, 4567 still whole.
	c.allocate("ns", "b01", "gpu-2x-seat.kyb.ai", onGPUs("0,1"), "node-b", "p", nil)
	// node-c: empty.

	v := seatview.Build(c.slices, c.claims, seatview.Options{})
	want := map[string]fragmentation.Measure{
		"node-a": {Free: 6, Largest: 4, Inside: 0, Fragmented: 6},
		"node-b": {Free: 6, Largest: 4, Inside: 4, Fragmented: 2},
		"node-c": {Free: 8, Largest: 4, Inside: 8, Fragmented: 0},
	}
	for _, n := range v.Nodes {
		if n.Fragmentation != want[n.Name] {
			t.Errorf("%s: %+v, want %+v", n.Name, n.Fragmentation, want[n.Name])
		}
	}
	if cluster := (fragmentation.Measure{Free: 20, Largest: 4, Inside: 12, Fragmented: 8}); v.Fragmentation != cluster {
		t.Errorf("cluster: %+v, want %+v", v.Fragmentation, cluster)
	}

	got := table(t, v, false)
	for _, line := range []string{
		"FRAGMENTATION FREE GPUS LARGEST GROUP IN FREE LARGEST GROUPS FRAGMENTED",
		"node-a 6 4 0 6 (100 %)",
		"node-b 6 4 4 2 (33 %)",
		"node-c 8 4 8 0 (0 %)",
		"all nodes 20 - 12 8 (40 %)",
	} {
		if !strings.Contains(squash(got), line+"\n") {
			t.Errorf("table lacks %q:\n%s", line, got)
		}
	}

	// --node: that node's line, and the total of the nodes shown.
	got = table(t, seatview.Build(c.slices, c.claims, seatview.Options{Node: "node-b"}), false)
	if !strings.Contains(squash(got), "node-b 6 4 4 2 (33 %)\nall nodes 6 - 4 2 (33 %)") || strings.Contains(got, "node-a") {
		t.Errorf("--node node-b:\n%s", got)
	}

	var out strings.Builder
	if err := seatview.WriteJSON(&out, v); err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Nodes []struct {
			Name          string         `json:"name"`
			Fragmentation map[string]int `json:"fragmentation"`
		} `json:"nodes"`
		Fragmentation map[string]int `json:"fragmentation"`
	}
	if err := json.Unmarshal([]byte(out.String()), &parsed); err != nil {
		t.Fatal(err)
	}
	if f := parsed.Nodes[0].Fragmentation; parsed.Nodes[0].Name != "node-a" || f["free"] != 6 || f["largestGroup"] != 4 || f["inside"] != 0 || f["fragmented"] != 6 {
		t.Errorf("JSON of node-a: %v", parsed.Nodes[0])
	}
	if f := parsed.Fragmentation; f["free"] != 20 || f["fragmented"] != 8 {
		t.Errorf("JSON of the cluster: %v", f)
	}
}

// A MIG instance holds part of its GPU: the GPU is not free, and the pair
// beside it is broken.
func TestFragmentationCountsAPartitionedGPUInUse(t *testing.T) {
	c := newClusterOf(t, "dgx-h100", `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 4}, gpus: [0]}
`, draresources.LayoutShared, "node-a")
	v := seatview.Build(c.slices, c.claims, seatview.Options{})
	if want := (fragmentation.Measure{Free: 8, Largest: 2, Inside: 8}); v.Nodes[0].Fragmentation != want {
		t.Errorf("no instance held: %+v, want %+v", v.Nodes[0].Fragmentation, want)
	}
	c.allocate("ns", "small", "mig-1g.10gb.kyb.ai", "", "node-a", "p", nil)
	v = seatview.Build(c.slices, c.claims, seatview.Options{})
	if want := (fragmentation.Measure{Free: 7, Largest: 2, Inside: 6, Fragmented: 1}); v.Nodes[0].Fragmentation != want {
		t.Errorf("an instance on GPU 0: %+v, want %+v", v.Nodes[0].Fragmentation, want)
	}
}

// A seat of an overprovisioning profile consumes no counter: the
// allocator still hands out the larger groups over its GPU, so the GPU
// stays free; a seat of a group that takes its GPUs holds them.
func TestFragmentationLeavesOverprovisionedGPUsFree(t *testing.T) {
	c := newClusterOf(t, "nvlink-2x4", `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, allowOverprovision: true}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-4x-seat}
`, draresources.LayoutShared, "node-a")
	c.allocate("ns", "shared", "gpu-1x-seat.kyb.ai", onGPUs("0"), "node-a", "p", nil)
	v := seatview.Build(c.slices, c.claims, seatview.Options{})
	if want := (fragmentation.Measure{Free: 8, Largest: 4, Inside: 8}); v.Nodes[0].Fragmentation != want {
		t.Errorf("an overprovisioned seat on GPU 0: %+v, want %+v", v.Nodes[0].Fragmentation, want)
	}
	// The real allocator agrees: the four-GPU group over GPU 0 is free.
	c.allocate("ns", "big", "gpu-4x-seat.kyb.ai", onGPUs("0,1,2,3"), "node-a", "p", nil)
	v = seatview.Build(c.slices, c.claims, seatview.Options{})
	if want := (fragmentation.Measure{Free: 4, Largest: 4, Inside: 4}); v.Nodes[0].Fragmentation != want {
		t.Errorf("and 0123 held: %+v, want %+v", v.Nodes[0].Fragmentation, want)
	}
}

// The per-seat layout publishes no counters; its groups never overlap.
// Its exclusive plan of seed: 2x on G01 and G23, 1x on GPUs 4..7, which
// no pair covers.
func TestFragmentationOfThePerSeatLayout(t *testing.T) {
	c := newCluster(t, draresources.LayoutPerSeat, "node-a")
	v := seatview.Build(c.slices, c.claims, seatview.Options{})
	if want := (fragmentation.Measure{Free: 8, Largest: 2, Inside: 4, Fragmented: 4}); v.Nodes[0].Fragmentation != want {
		t.Errorf("empty: %+v, want %+v", v.Nodes[0].Fragmentation, want)
	}
	c.allocate("ns", "pair", "gpu-2x-seat.kyb.ai", onGPUs("2,3"), "node-a", "p", nil)
	c.allocate("ns", "one", "gpu-1x-seat.kyb.ai", onGPUs("4"), "node-a", "p", nil)
	v = seatview.Build(c.slices, c.claims, seatview.Options{})
	if want := (fragmentation.Measure{Free: 5, Largest: 2, Inside: 2, Fragmented: 3}); v.Nodes[0].Fragmentation != want {
		t.Errorf("G23 and GPU 4 held: %+v, want %+v", v.Nodes[0].Fragmentation, want)
	}
}
