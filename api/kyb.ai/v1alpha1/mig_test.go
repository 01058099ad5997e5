package v1alpha1

import (
	"strings"
	"testing"
)

func TestMIGProfileDefaults(t *testing.T) {
	cfg, _, err := LoadNodeConfig([]byte(`profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
- resource: kyb.ai/mig-1g.10gb-me
  mig: {profile: 1g.10gb+me}
- resource: kyb.ai/mig-3g
  name: three
  gpus: [0, 1]
  mig: {profile: 3g.40gb, seatsPerGPU: 1}
`), "c.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name, mig string
		seats     int // 0: left to the GPU model
	}{
		{"mig-1g-10gb", "1g.10gb", 0},
		{"mig-1g-10gb-me", "1g.10gb+me", 0},
		{"three", "3g.40gb", 1},
	}
	for i, w := range want {
		p := cfg.Profiles[i]
		if !p.IsMIG() || p.Name != w.name || p.Size() != 1 || p.MIG.Profile != w.mig {
			t.Errorf("profiles[%d]: name %q, size %d, mig %+v; want %s, 1, %s", i, p.Name, p.Size(), p.MIG, w.name, w.mig)
		}
		if got := p.MIG.SeatsPerGPU; (w.seats == 0) != (got == nil) || (got != nil && *got != w.seats) {
			t.Errorf("profiles[%d]: seatsPerGPU %v, want %d (0: unset)", i, got, w.seats)
		}
	}
}

func TestMIGProfileErrorsNameTheLine(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"no MIG profile", `profiles:
- resource: kyb.ai/mig-small
  mig: {}
`, []string{"c.yaml:3: profiles[0].mig.profile: required"}},
		{"no seats", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig:
    profile: 1g.10gb
    seatsPerGPU: 0
`, []string{"c.yaml:5: profiles[0].mig.seatsPerGPU: must be at least 1, not 0"}},
		{"with mps", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
  sharing: {strategy: mps}
`, []string{"c.yaml:4: profiles[0].sharing: does not apply to a MIG profile"}},
		{"with a time slice", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
  sharing:
    timeSlicing: {interval: Short}
`, []string{"c.yaml:4: profiles[0].sharing: does not apply to a MIG profile"}},
		{"groups of two GPUs", `profiles:
- resource: kyb.ai/mig-1g.10gb
  gpusPerGroup: 2
  mig: {profile: 1g.10gb}
`, []string{"c.yaml:3: profiles[0].gpusPerGroup: a MIG profile's groups are single GPUs"}},
		{"a resource that names groups of two", `profiles:
- resource: kyb.ai/mig-2x-1g
  mig: {profile: 1g.10gb}
`, []string{`c.yaml:2: profiles[0].resource: "kyb.ai/mig-2x-1g" names groups of 2 GPUs; a MIG profile's groups are single GPUs`}},
		{"seats per group", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
  seatsPerGroup: 2
`, []string{"c.yaml:4: profiles[0].seatsPerGroup: does not apply to a MIG profile, whose seats are instances: use mig.seatsPerGPU"}},
		{"overprovisioned", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
  allowOverprovision: true
`, []string{"c.yaml:4: profiles[0].allowOverprovision: does not apply to a MIG profile"}},
		{"a misspelt field", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb, seatsPerGpu: 2}
`, []string{"c.yaml:3: profiles[0].mig.seatsPerGpu: unknown field"}},
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
		})
	}
}
