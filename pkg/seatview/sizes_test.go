package seatview_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
)

// On nvlink-2x4 (80 GiB GPUs): sized single GPUs G0 and G1, sized pairs
// G45 and G67, and equal seats on G2 and G3.
const sizedSeed = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 4
  gpus: [0, 1]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 2
  gpus: [4, 5, 6, 7]
  sharing: {strategy: mps, sized: true}
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, gpus: [2, 3]}
`

// size asks a sized seat's memory and compute; empty asks nothing of it.
func size(memory, compute string) []func(*resourceapi.DeviceRequest) {
	var out []func(*resourceapi.DeviceRequest)
	if memory != "" {
		out = append(out, schedulertest.WithCapacity("memory", memory))
	}
	if compute != "" {
		out = append(out, schedulertest.WithCapacity("compute", compute))
	}
	return out
}

func onGroup(name string) string {
	return `device.attributes["gpu.kyb.ai"].group == "` + name + `"`
}

// sizedCluster is node-a with claims on its sized groups, allocated by the
// scheduler's allocator: G0 holds three sizes (one asking nothing, whose
// status the plugin has not written yet), G1 all of its memory and SMs in
// one claim, G45 one size, G67 nothing; G2 an equal seat.
func sizedCluster(t *testing.T) *cluster {
	c := newClusterOf(t, "nvlink-2x4", sizedSeed, draresources.LayoutShared, "node-a")
	c.allocate("team-a", "small", "gpu-1x-sized.kyb.ai", onGroup("G0"), "node-a", "infer-1", []int{0}, size("16Gi", "30")...)
	c.allocate("team-b", "big", "gpu-1x-sized.kyb.ai", onGroup("G0"), "node-a", "batch", []int{1}, size("40Gi", "10")...)
	c.allocate("team-a", "plain", "gpu-1x-sized.kyb.ai", onGroup("G0"), "node-a", "notebook", nil)
	c.allocate("team-b", "whole", "gpu-1x-sized.kyb.ai", onGroup("G1"), "node-a", "train", []int{0}, size("80Gi", "100")...)
	c.allocate("team-a", "pair", "gpu-2x-sized.kyb.ai", onGroup("G45"), "node-a", "p2", []int{0}, size("30Gi", "50")...)
	c.allocate("team-a", "equal", "gpu-1x-seat.kyb.ai", onGroup("G2"), "node-a", "e", []int{1})
	return c
}

// Each sized group shows the memory (per GPU) and compute its claims'
// allocations consumed of what it publishes, each holder its size, and
// the summary what is free per sized profile. A claim that asked nothing
// holds the profile's default (80Gi over 4 seats: 20Gi and 25 %). G1 has
// three seats left and no memory: it takes no new claim, so it is full.
func TestSizedGroupsShowHeldAndFreeMemoryAndCompute(t *testing.T) {
	c := sizedCluster(t)
	v := seatview.Build(c.slices, c.claims, seatview.Options{})

	const gi = int64(1) << 30
	for _, tc := range []struct {
		device string
		state  string
		want   seatview.Sizes
	}{
		{"g0-1x-sized", seatview.StateInUse, seatview.Sizes{MemoryBytes: 80 * gi, HeldMemoryBytes: 76 * gi, FreeMemoryBytes: 4 * gi, ComputePercent: 100, HeldComputePercent: 65, FreeComputePercent: 35}},
		{"g1-1x-sized", seatview.StateFull, seatview.Sizes{MemoryBytes: 80 * gi, HeldMemoryBytes: 80 * gi, ComputePercent: 100, HeldComputePercent: 100}},
		{"g45-2x-sized", seatview.StateInUse, seatview.Sizes{MemoryBytes: 80 * gi, HeldMemoryBytes: 30 * gi, FreeMemoryBytes: 50 * gi, ComputePercent: 100, HeldComputePercent: 50, FreeComputePercent: 50}},
		{"g67-2x-sized", seatview.StateFree, seatview.Sizes{MemoryBytes: 80 * gi, FreeMemoryBytes: 80 * gi, ComputePercent: 100, FreeComputePercent: 100}},
	} {
		g := group(t, v, "node-a", tc.device)
		if g.Sizes == nil || g.State != tc.state || exported(t, *g.Sizes) != exported(t, tc.want) {
			t.Errorf("%s: %s, sizes %s; want %s, %s", tc.device, g.State, exported(t, g.Sizes), tc.state, exported(t, tc.want))
		}
	}
	if g := group(t, v, "node-a", "g2-1x"); g.Sizes != nil || len(g.Held) != 1 || g.Held[0].Size != nil {
		t.Errorf("an equal seat's group has sizes %+v, its seat %+v", g.Sizes, g.Held)
	}
	g0 := group(t, v, "node-a", "g0-1x-sized")
	var held []string
	for _, h := range g0.Held {
		held = append(held, fmt.Sprintf("%s %+v", h.Claim, *h.Size))
	}
	if want := []string{
		"team-a/small {MemoryBytes:17179869184 ComputePercent:30}",
		"team-b/big {MemoryBytes:42949672960 ComputePercent:10}",
		"team-a/plain {MemoryBytes:21474836480 ComputePercent:25}",
	}; strings.Join(held, "; ") != strings.Join(want, "; ") {
		t.Errorf("G0's holders:\n%s\nwant\n%s", strings.Join(held, "\n"), strings.Join(want, "\n"))
	}
	wantSizes := []seatview.ProfileSizes{
		{Profile: "1x-sized", FreeMemoryBytes: 4 * gi, LargestFreeMemoryBytes: 4 * gi, MemoryBytes: 160 * gi, FreeComputePercent: 35, LargestFreeComputePercent: 35, ComputePercent: 200},
		{Profile: "2x-sized", FreeMemoryBytes: 130 * gi, LargestFreeMemoryBytes: 80 * gi, MemoryBytes: 160 * gi, FreeComputePercent: 150, LargestFreeComputePercent: 100, ComputePercent: 200},
	}
	if fmt.Sprintf("%+v", v.Sizes) != fmt.Sprintf("%+v", wantSizes) {
		t.Errorf("sizes per profile\n%+v\nwant\n%+v", v.Sizes, wantSizes)
	}
	// G1, full of memory, has no free seat to offer.
	wantFree := []seatview.ProfileSeats{{Profile: "1x", Free: 3, Total: 4}, {Profile: "1x-sized", Free: 1, Total: 8}, {Profile: "2x-sized", Free: 3, Total: 4}}
	if fmt.Sprint(v.Free) != fmt.Sprint(wantFree) {
		t.Errorf("free seats %v, want %v", v.Free, wantFree)
	}

	got := table(t, v, false)
	for _, line := range []string{
		"DEVICE GROUP PROFILE GPUS SEATS HELD MEMORY COMPUTE STATE HELD BY",
		"g0-1x-sized G0 1x-sized 0 4 3 76Gi/80Gi 65/100 % in use 0: team-a/small (team-a/infer-1) 16Gi 30 %; 1: team-b/big (team-b/batch) 40Gi 10 %; ?: team-a/plain (team-a/notebook) 20Gi 25 %",
		"g1-1x-sized G1 1x-sized 1 4 1 80Gi/80Gi 100/100 % full 0: team-b/whole (team-b/train) 80Gi 100 %",
		"g45-2x-sized G45 2x-sized 4,5 2 1 30Gi/80Gi 50/100 % in use 0: team-a/pair (team-a/p2) 30Gi 50 %",
		"g67-2x-sized G67 2x-sized 6,7 2 0 0/80Gi 0/100 % free -",
		"g2-1x G2 1x 2 2 1 - - in use 1: team-a/equal (team-a/e)",
		"FREE SIZES MEMORY FREE MOST ON ONE GROUP MEMORY COMPUTE FREE MOST ON ONE GROUP COMPUTE",
		"1x-sized 4Gi 4Gi 160Gi 35 % 35 % 200 %",
		"2x-sized 130Gi 80Gi 160Gi 150 % 100 % 200 %",
	} {
		if !strings.Contains(squash(got), line) {
			t.Errorf("table lacks %q:\n%s", line, got)
		}
	}

	// Seen from one namespace, the others' sizes are held, not named.
	v = seatview.Build(c.slices, c.claims, seatview.Options{Namespace: "team-a"})
	got = table(t, v, false)
	if line := "g0-1x-sized G0 1x-sized 0 4 3 76Gi/80Gi 65/100 % in use 0: team-a/small (team-a/infer-1) 16Gi 30 %; ?: team-a/plain (team-a/notebook) 20Gi 25 %; 1 in other namespaces"; !strings.Contains(squash(got), line) {
		t.Errorf("team-a's table lacks %q:\n%s", line, got)
	}
}

// The JSON contract's fields of sizes, as README documents them.
func TestSizedGroupsInJSON(t *testing.T) {
	c := sizedCluster(t)
	var out strings.Builder
	if err := seatview.WriteJSON(&out, seatview.Build(c.slices, c.claims, seatview.Options{})); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Nodes []struct {
			Groups []struct {
				Device string          `json:"device"`
				Sizes  json.RawMessage `json:"sizes"`
				Held   []struct {
					Claim string             `json:"claim"`
					Size  *v1alpha1.SeatSize `json:"size"`
				} `json:"held"`
			} `json:"groups"`
		} `json:"nodes"`
		Sizes json.RawMessage `json:"sizes"`
	}
	if err := json.Unmarshal([]byte(out.String()), &doc); err != nil {
		t.Fatal(err)
	}
	for _, g := range doc.Nodes[0].Groups {
		switch g.Device {
		case "g45-2x-sized":
			want := `{"memoryBytes":85899345920,"heldMemoryBytes":32212254720,"freeMemoryBytes":53687091200,"computePercent":100,"heldComputePercent":50,"freeComputePercent":50}`
			if string(compact(t, g.Sizes)) != want {
				t.Errorf("g45-2x-sized's sizes %s, want %s", compact(t, g.Sizes), want)
			}
			if len(g.Held) != 1 || g.Held[0].Size == nil || *g.Held[0].Size != (v1alpha1.SeatSize{MemoryBytes: 30 << 30, ComputePercent: 50}) {
				t.Errorf("g45-2x-sized's holder %+v", g.Held)
			}
		case "g2-1x":
			if g.Sizes != nil || g.Held[0].Size != nil {
				t.Errorf("an equal seat's group has sizes %s, its seat %+v", g.Sizes, g.Held[0].Size)
			}
		}
	}
	want := `[{"profile":"1x-sized","freeMemoryBytes":4294967296,"largestFreeMemoryBytes":4294967296,"memoryBytes":171798691840,"freeComputePercent":35,"largestFreeComputePercent":35,"computePercent":200},` +
		`{"profile":"2x-sized","freeMemoryBytes":139586437120,"largestFreeMemoryBytes":85899345920,"memoryBytes":171798691840,"freeComputePercent":150,"largestFreeComputePercent":100,"computePercent":200}]`
	if string(compact(t, doc.Sizes)) != want {
		t.Errorf("sizes %s\nwant  %s", compact(t, doc.Sizes), want)
	}

	// A cluster without sized profiles prints no sizes, and an empty list.
	plain := newCluster(t, draresources.LayoutShared, "node-a")
	out.Reset()
	if err := seatview.WriteJSON(&out, seatview.Build(plain.slices, nil, seatview.Options{})); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"sizes": []`) || strings.Count(out.String(), `"sizes"`) != 1 {
		t.Errorf("without sized profiles: %s", out.String())
	}
	if got := table(t, seatview.Build(plain.slices, nil, seatview.Options{}), false); strings.Contains(got, "MEMORY") || strings.Contains(got, "FREE SIZES") {
		t.Errorf("without sized profiles the table has sizes:\n%s", got)
	}
}

// exported is what a value shows in -o json.
func exported(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func compact(t *testing.T, raw json.RawMessage) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return b.Bytes()
}
