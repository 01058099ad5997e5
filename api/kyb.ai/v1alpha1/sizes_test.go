package v1alpha1

import (
	"math"
	"strings"
	"testing"
)

func TestSizedProfilesWhoseSizesDoNotAddUpAreRefusedWithTheField(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"sized without mps", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 8
  sharing:
    sized: true
`, []string{`c.yaml:5: profiles[0].sharing.sized: needs strategy "mps": a seat's size is held by its MPS client's limits; strategy is "timeSlicing"`}},
		{"sized with allowOverprovision", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 8
  allowOverprovision: true
  sharing: {strategy: mps, sized: true}
`, []string{`c.yaml:5: profiles[0].sharing.strategy: "mps" cannot be combined with allowOverprovision`}},
		{"sized with one seat", `profiles:
- resource: kyb.ai/gpu-1x-seat
  sharing: {strategy: mps, sized: true}
`, []string{`c.yaml:3: profiles[0].sharing.strategy: "mps" shares a group between seats: set seatsPerGroup to 2 or more`}},
		{"sized on a MIG profile", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
  sharing: {strategy: mps, sized: true}
`, []string{`c.yaml:4: profiles[0].sharing: does not apply to a MIG profile`}},
		{"sizes without sized", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 8
  sharing:
    strategy: mps
    sizes:
      memory: {default: 8Gi}
`, []string{`c.yaml:6: profiles[0].sharing.sizes: applies to sized profiles only: set sized: true`}},
		{"default below min, off the step, compute above 100", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 8
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory:
        default: 2Gi
        min: 4Gi
      compute:
        default: 120
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 4
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory: {default: 10Gi, min: 1Gi, step: 2Gi}
      compute: {default: 30, min: 5, step: 10}
`, []string{
			"c.yaml:9: profiles[0].sharing.sizes.memory.default: 2Gi is below min 4Gi",
			"c.yaml:12: profiles[0].sharing.sizes.compute.default: must be at most 100 (per cent of the SMs), not 120",
			"c.yaml:19: profiles[1].sharing.sizes.memory.default: 10Gi is off the step: sizes are min 1Gi plus a whole number of steps of 2Gi",
			"c.yaml:20: profiles[1].sharing.sizes.compute.default: 30 % is off the step: sizes are min 5 % plus a whole number of steps of 10 %",
		}},
		{"values that are no sizes", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 8
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory:
        default: 16GB of HBM
        min: 0
        step: 0.5
      compute:
        step: 0
`, []string{
			`c.yaml:9: profiles[0].sharing.sizes.memory.default: "16GB of HBM" is not a quantity (such as 16Gi)`,
			"c.yaml:10: profiles[0].sharing.sizes.memory.min: must be more than 0, not 0",
			"c.yaml:11: profiles[0].sharing.sizes.memory.step: 0.5 is not a whole number of bytes",
			"c.yaml:13: profiles[0].sharing.sizes.compute.step: must be more than 0, not 0",
		}},
		{"a compute step past all the SMs", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 2
  sharing:
    strategy: mps
    sized: true
    sizes:
      compute: {min: 50, step: 60, default: 50}
`, []string{"c.yaml:8: profiles[0].sharing.sizes.compute.step: min 50 plus one step 60 is more than 100: the API server refuses such a request policy"}},
		{"compute given as a string", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 2
  sharing:
    strategy: mps
    sized: true
    sizes:
      compute: {default: "25"}
`, []string{`c.yaml:8: profiles[0].sharing.sizes.compute.default: expected an integer, got a string`}},
		{"memory given as a list", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 2
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory: {default: [16Gi]}
`, []string{`c.yaml:11: profiles[1].sharing.sizes.memory.default: expected a string, got a list`}},
		{"a field of its own that is unknown", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 2
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory: {max: 20Gi}
`, []string{`c.yaml:8: profiles[0].sharing.sizes.memory.max: unknown field`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := LoadNodeConfig([]byte(tc.doc), "c.yaml")
			if err == nil {
				t.Fatal("expected an error")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error:\n%s\ndoes not contain %q", err, want)
				}
			}
			if n, m := strings.Count(err.Error(), "\n")+1, len(tc.want); n != m {
				t.Errorf("%d errors, want %d:\n%s", n, m, err)
			}
		})
	}
}

func TestSizedProfileRulesAndTheirDefaults(t *testing.T) {
	cfg, _, err := LoadNodeConfig([]byte(`profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 4
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory: {default: 20Gi, min: 2Gi, step: 2Gi}
      compute: {default: 25, min: 5, step: 5}
- resource: kyb.ai/gpu-4x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps}
- resource: kyb.ai/gpu-8x-sized
  seatsPerGroup: 2
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory: {min: 17179869184}
`), "c.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		profile int
		want    SizeRules
		sized   bool
	}{
		{0, SizeRules{Memory: SizeRule{Min: 1 << 30, Step: 1 << 30}, Compute: SizeRule{Min: 1, Step: 1}}, true},
		{1, SizeRules{Memory: SizeRule{Default: 20 << 30, Min: 2 << 30, Step: 2 << 30}, Compute: SizeRule{Default: 25, Min: 5, Step: 5}}, true},
		{2, SizeRules{}, false},
		{3, SizeRules{Memory: SizeRule{Min: 16 << 30, Step: 1 << 30}, Compute: SizeRule{Min: 1, Step: 1}}, true},
	}
	for _, tc := range tests {
		got, sized := cfg.Profiles[tc.profile].SizeRules()
		if got != tc.want || sized != tc.sized {
			t.Errorf("profiles[%d]: rules %+v (sized %v), want %+v (%v)", tc.profile, got, sized, tc.want, tc.sized)
		}
	}
}

func TestEqualShareIsRoundedDownToTheStepAndNeverBelowTheMinimum(t *testing.T) {
	const gib = 1 << 30
	h200 := int64(143771) << 20
	tests := []struct {
		name     string
		rule     SizeRule
		capacity int64
		seats    int
		want     int64
	}{
		{"an H200 among 8", SizeRule{Min: gib, Step: gib}, h200, 8, 17 * gib},
		{"an H200 among 3, steps of 4Gi above 2Gi", SizeRule{Min: 2 * gib, Step: 4 * gib}, h200, 3, 46 * gib},
		{"compute among 8", SizeRule{Min: 1, Step: 1}, 100, 8, 12},
		{"compute among 3 in steps of 5", SizeRule{Min: 5, Step: 5}, 100, 3, 30},
		{"compute among 128", SizeRule{Min: 1, Step: 1}, 100, 128, 1},
		{"a share below the minimum", SizeRule{Min: 16 * gib, Step: gib}, 80 * gib, 8, 16 * gib},
	}
	for _, tc := range tests {
		if got := tc.rule.EqualShare(tc.capacity, tc.seats); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestConsumedIsTheRequestRoundedUpToTheNextStep(t *testing.T) {
	const gib = 1 << 30
	mem := SizeRule{Default: 17 * gib, Min: gib, Step: gib}
	tests := []struct {
		name      string
		rule      SizeRule
		requested int64
		asked     bool
		want      int64
	}{
		{"nothing asked: the default", mem, 0, false, 17 * gib},
		{"on the step", mem, 20 * gib, true, 20 * gib},
		{"off the step: the next one", mem, 20*gib + gib/2, true, 21 * gib},
		{"one byte past a step", mem, 20*gib + 1, true, 21 * gib},
		{"below the minimum", mem, 100 << 20, true, gib},
		{"zero", mem, 0, true, gib},
		{"steps of 4Gi above 2Gi", SizeRule{Default: 2 * gib, Min: 2 * gib, Step: 4 * gib}, 7 * gib, true, 10 * gib},
		{"no step: as asked", SizeRule{Min: 5}, 12, true, 12},
		{"past an int64", SizeRule{Min: 1, Step: 1 << 62}, math.MaxInt64, true, math.MaxInt64},
	}
	for _, tc := range tests {
		if got := tc.rule.Consumed(tc.requested, tc.asked); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	for v, want := range map[int64]bool{17 * gib: true, gib: true, 21 * gib: true, 21*gib + 1: false, gib / 2: false} {
		if got := mem.Allows(v); got != want {
			t.Errorf("Allows(%d) = %t, want %t", v, got, want)
		}
	}
	if off := (SizeRule{Default: 10, Min: 4, Step: 4}); !off.Allows(10) || off.Allows(14) {
		t.Errorf("a default off the step is allowed, other sizes off it are not")
	}
}
