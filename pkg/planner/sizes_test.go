package planner_test

import (
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

const gib = int64(1) << 30

func TestSizedGroupsOfferTheirSmallestGPUsMemoryAndAnEqualShareByDefault(t *testing.T) {
	inv := presetInventory(t, "dgx-h200")
	// A node whose GPU 1 has less memory: a group's memory is per GPU,
	// so the smallest GPU decides.
	inv.GPUs[1].MemoryMiB = 81559
	plan, err := planner.New(inv, loadConfig(t, `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 3
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory: {min: 2Gi, step: 4Gi}
      compute: {default: 40, min: 10, step: 10}
- resource: kyb.ai/gpu-4x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps}
`))
	if err != nil {
		t.Fatal(err)
	}
	h200 := int64(143771) << 20
	h100 := int64(81559) << 20
	tests := []struct {
		device string
		want   planner.Sizes
	}{
		{"g0-1x-sized", planner.Sizes{Seats: 8,
			Memory:  planner.SizeRange{Capacity: h200, Default: 17 * gib, Min: gib, Step: gib},
			Compute: planner.SizeRange{Capacity: 100, Default: 12, Min: 1, Step: 1}}},
		{"g1-1x-sized", planner.Sizes{Seats: 8,
			Memory:  planner.SizeRange{Capacity: h100, Default: 9 * gib, Min: gib, Step: gib},
			Compute: planner.SizeRange{Capacity: 100, Default: 12, Min: 1, Step: 1}}},
		// 2 + 4k GiB: a third of 79.6 GiB is 26.5, down to 26.
		{"g01-2x-sized", planner.Sizes{Seats: 3,
			Memory:  planner.SizeRange{Capacity: h100, Default: 26 * gib, Min: 2 * gib, Step: 4 * gib},
			Compute: planner.SizeRange{Capacity: 100, Default: 40, Min: 10, Step: 10}}},
		{"g23-2x-sized", planner.Sizes{Seats: 3,
			Memory:  planner.SizeRange{Capacity: h200, Default: 46 * gib, Min: 2 * gib, Step: 4 * gib},
			Compute: planner.SizeRange{Capacity: 100, Default: 40, Min: 10, Step: 10}}},
	}
	for _, tc := range tests {
		g := plan.GroupByDevice(tc.device)
		if g == nil {
			t.Fatalf("no group %s", tc.device)
		}
		got, sized := g.Sizes()
		if !sized || got != tc.want {
			t.Errorf("%s: %+v (sized %v), want %+v", tc.device, got, sized, tc.want)
		}
	}
	if _, sized := plan.GroupByDevice("g0123-4x").Sizes(); sized {
		t.Error("an mps profile that is not sized offers sizes")
	}
}

func TestSizedMemoryThatDoesNotFitTheGPUsIsRefusedWithTheField(t *testing.T) {
	tests := []struct {
		name   string
		config string
		want   string
	}{
		{"a default above the GPU's memory", `
profiles:
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 4
  sharing: {strategy: mps, sized: true, sizes: {memory: {default: 100Gi}}}
`, "profiles[0].sharing.sizes.memory.default: 100Gi is more than the 81559Mi of each GPU of group G01 (GPUs 0,1)"},
		{"a first step past the GPU's memory", `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 4
  sharing: {strategy: mps, sized: true, sizes: {memory: {min: 60Gi, step: 30Gi, default: 60Gi}}}
`, "profiles[0].sharing.sizes.memory.min: min 60Gi plus one step 30Gi is more than the 81559Mi of GPU 0"},
	}
	inv := presetInventory(t, "dgx-h100")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := planner.New(inv, loadConfig(t, tc.config))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestSizedProfilesHaveNoSeatsInTheExclusiveLayout(t *testing.T) {
	plan, err := planner.New(presetInventory(t, "dgx-h100"), loadConfig(t, `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  gpus: [0, 1, 2, 3]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  gpus: [4, 5, 6, 7]
  sharing: {strategy: mps}
`))
	if err != nil {
		t.Fatal(err)
	}
	layout, why := plan.ExclusiveLayout()
	want := []profileSpec{
		{"1x", 4, []string{"G4:4:none", "G5:5:none", "G6:6:none", "G7:7:none"}},
		{"1x-sized", 8, nil},
	}
	if got := describe(layout); !equalSpecs(got, want) {
		t.Errorf("layout:\n got %+v\nwant %+v", got, want)
	}
	if !strings.Contains(why, "sized profile(s) 1x-sized get no seats") {
		t.Errorf("the layout's reason %q does not name the sized profile", why)
	}
	if !strings.Contains(strings.Join(layout.Warnings, "\n"), "profile 1x-sized is sized and has no seats in the exclusive layout") {
		t.Errorf("warnings %q do not name the sized profile", layout.Warnings)
	}
}
