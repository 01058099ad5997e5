package v1alpha1

import (
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
