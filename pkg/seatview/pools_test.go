package seatview_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// Two seats per 1x group: 16 1x seats on a node of 8 GPUs.
const seed16 = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
groups: [{name: G01, gpus: [0, 1]}, {name: G23, gpus: [2, 3]}]
`

// generation is node's pool as the plugin publishes it from config, under
// a generation, with slice names that start with prefix (the names decide
// the order the view reads them in).
func generation(t *testing.T, node, config string, layout draresources.Layout, gen int64, prefix string) []resourceapi.ResourceSlice {
	t.Helper()
	sn := simnodetest.New(t, "nvlink-2x4", config)
	var out []resourceapi.ResourceSlice
	for i, s := range draresources.ResourceSlices(draresources.Resources(sn.Plan, sn.Inv, node, layout), node) {
		s.Name = fmt.Sprintf("%s-%s-%d", prefix, node, i)
		s.Spec.Pool.Generation = gen
		out = append(out, *s)
	}
	return out
}

// While the plugin republishes its pool, the slices of the old generation
// are listed beside the new one's. The scheduler allocates from the newest
// generation alone; so do the seats shown. Before, each per-seat device
// counted twice (32 1x seats where there are 16), and in the shared layout
// the old generation's seat counts won where its slices sorted last (32
// again, from four seats per group before two).
func TestSeatsOfTheNewestGeneration(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layout draresources.Layout
		// newest and old are the configurations the generations were
		// published from.
		newest, old string
		want        []seatview.ProfileSeats
		// device is a group with seats seats in the newest generation.
		device string
		seats  int
	}{{
		name:   "per-seat layout, both generations alike",
		layout: draresources.LayoutPerSeat, newest: seed, old: seed,
		want:   []seatview.ProfileSeats{{Profile: "1x", Free: 16, Total: 16}, {Profile: "2x", Free: 6, Total: 6}},
		device: "g4-1x", seats: 4,
	}, {
		name:   "shared layout, four seats per 1x group before two",
		layout: draresources.LayoutShared, newest: seed16, old: seed,
		want:   []seatview.ProfileSeats{{Profile: "1x", Free: 16, Total: 16}, {Profile: "2x", Free: 12, Total: 12}},
		device: "g0-1x", seats: 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			resourceSlices := append(generation(t, "node-a", tc.newest, tc.layout, 2, "a"), generation(t, "node-a", tc.old, tc.layout, 1, "b")...)
			v := seatview.Build(resourceSlices, nil, seatview.Options{})
			if fmt.Sprint(v.Free) != fmt.Sprint(tc.want) {
				t.Errorf("free seats %v, want %v", v.Free, tc.want)
			}
			if g := group(t, v, "node-a", tc.device); g.Seats != tc.seats {
				t.Errorf("%s has %d seats, want %d", tc.device, g.Seats, tc.seats)
			}
			if len(v.Nodes) != 1 || len(v.Nodes[0].IncompletePools) != 0 {
				t.Errorf("nodes: %+v", v.Nodes)
			}
		})
	}
}

// A newest generation that lacks slices is incomplete: the scheduler
// allocates nothing from the pool until it is complete, and does not fall
// back to the older generation. The view shows no group of the pool, counts
// none of its seats, and says why.
func TestIncompleteNewestGeneration(t *testing.T) {
	old := generation(t, "node-a", seed16, draresources.LayoutShared, 1, "a")
	newest := generation(t, "node-a", seed16, draresources.LayoutShared, 2, "b")
	if len(newest) != 2 || newest[0].Spec.Pool.ResourceSliceCount != 2 {
		t.Fatalf("the shared layout's pool: %d slices, want the counters' and the devices'", len(newest))
	}
	resourceSlices := slices.Concat(old, newest[1:2], generation(t, "node-b", seed16, draresources.LayoutShared, 1, "c"))

	v := seatview.Build(resourceSlices, nil, seatview.Options{})
	if len(v.Nodes) != 2 {
		t.Fatalf("nodes: %+v", v.Nodes)
	}
	a := v.Nodes[0]
	wantPool := []seatview.IncompletePool{{Pool: "node-a", Generation: 2, Slices: 1, ResourceSliceCount: 2}}
	if a.Name != "node-a" || len(a.Groups) != 0 || fmt.Sprint(a.IncompletePools) != fmt.Sprint(wantPool) {
		t.Errorf("node-a: %+v, want no group and incomplete pools %+v", a, wantPool)
	}
	if b := v.Nodes[1]; len(b.Groups) != 12 || len(b.IncompletePools) != 0 {
		t.Errorf("node-b: %+v", b)
	}
	want := []seatview.ProfileSeats{{Profile: "1x", Free: 16, Total: 16}, {Profile: "2x", Free: 12, Total: 12}}
	if fmt.Sprint(v.Free) != fmt.Sprint(want) {
		t.Errorf("free seats %v, want node-b's alone, %v", v.Free, want)
	}

	var out strings.Builder
	if err := seatview.WriteTable(&out, v, false); err != nil {
		t.Fatal(err)
	}
	wantText := "NODE node-a\n" +
		"NOTE: pool node-a is incomplete (being published): 1 of the 2 ResourceSlices of its generation 2 are listed; " +
		"the scheduler allocates none of its devices until all are, so its groups are not shown\n\nNODE node-b\n"
	if !strings.HasPrefix(out.String(), wantText) {
		t.Errorf("table:\n%s\nwant it to start with\n%s", out.String(), wantText)
	}
	out.Reset()
	if err := seatview.WriteJSON(&out, v); err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Nodes []struct {
			Name            string           `json:"name"`
			IncompletePools []map[string]any `json:"incompletePools"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out.String()), &decoded); err != nil {
		t.Fatal(err)
	}
	wantJSON := "[map[generation:2 pool:node-a resourceSliceCount:2 slices:1]]"
	if len(decoded.Nodes) != 2 || fmt.Sprint(decoded.Nodes[0].IncompletePools) != wantJSON || decoded.Nodes[1].IncompletePools != nil {
		t.Errorf("JSON: %+v, want node-a's incompletePools %s and none on node-b:\n%s", decoded.Nodes, wantJSON, out.String())
	}

	// --node shows the node and its note alone.
	v = seatview.Build(resourceSlices, nil, seatview.Options{Node: "node-b"})
	if len(v.Nodes) != 1 || v.Nodes[0].Name != "node-b" {
		t.Errorf("--node node-b: %+v", v.Nodes)
	}
}
