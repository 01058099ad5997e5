package planner_test

import (
	"errors"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

func migDeviceNames(plan *planner.Plan) []string {
	var out []string
	for _, d := range plan.MIGDevices() {
		out = append(out, d.DeviceName())
	}
	return out
}

func TestMIGProfileSeatsAreInstancesOnSingleGPUs(t *testing.T) {
	plan, err := planner.New(presetInventory(t, "dgx-h100"), loadConfig(t, `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}
- {resource: kyb.ai/mig-3g.40gb, mig: {profile: 3g.40gb, seatsPerGPU: 1}, gpus: [1, 2]}
`))
	if err != nil {
		t.Fatal(err)
	}
	small, big := plan.Profile("mig-1g-10gb"), plan.Profile("mig-3g-40gb")
	if small == nil || big == nil || small.MIG == nil || big.MIG == nil {
		t.Fatalf("MIG profiles missing: %v", plan.Profiles)
	}
	if len(small.Groups) != 0 || len(big.Groups) != 0 {
		t.Errorf("MIG profiles must have no whole-GPU groups: %v %v", small.Groups, big.Groups)
	}
	if len(small.MIG.GPUs) != 1 || small.MIG.GPUs[0].Index() != 0 || small.MIG.GPUs[0].Seats != 7 || small.MIG.GPUs[0].Model.Name != "H100-80GB" || small.MIG.GPUs[0].Profile.ID != 19 {
		t.Errorf("1g.10gb: %+v, want GPU 0 of an H100-80GB with 7 seats of profile ID 19", small.MIG.GPUs[0])
	}
	if small.Seats() != 7 || big.Seats() != 2 || big.SeatsPerGroup != 1 {
		t.Errorf("seats: 1g.10gb %d, 3g.40gb %d (%d per GPU); want 7, 2 (1)", small.Seats(), big.Seats(), big.SeatsPerGroup)
	}
	for _, g := range plan.Groups() {
		if g.Profile.MIG != nil {
			t.Errorf("plan.Groups() holds MIG group %s", g.Name)
		}
	}
	want := "g0-mig-1g-10gb-6 g0-mig-1g-10gb-5 g0-mig-1g-10gb-4 g0-mig-1g-10gb-3 g0-mig-1g-10gb-2 g0-mig-1g-10gb-1 g0-mig-1g-10gb-0 " +
		"g1-mig-3g-40gb-4 g1-mig-3g-40gb-0 g2-mig-3g-40gb-4 g2-mig-3g-40gb-0"
	if got := strings.Join(migDeviceNames(plan), " "); got != want {
		t.Errorf("MIG devices:\n%s\nwant\n%s", got, want)
	}
	if m := plan.MIGModels(); len(m) != 3 || m[2].Name != "H100-80GB" {
		t.Errorf("MIG GPUs %v, want 0, 1 and 2", m)
	}
	if _, why := plan.ExclusiveLayout(); strings.Contains(why, "mig") {
		t.Errorf("the exclusive layout hands out MIG GPUs: %s", why)
	}
}

func TestMIGDevicesSpreadGoesFromGPUToGPU(t *testing.T) {
	plan, err := planner.New(presetInventory(t, "dgx-a100"), loadConfig(t, `
allocationPolicy: spread
profiles:
- {resource: kyb.ai/mig-4g.20gb, mig: {profile: 4g.20gb}, gpus: [0, 1, 2]}
- {resource: kyb.ai/mig-3g.20gb, mig: {profile: 3g.20gb}, gpus: [0, 1]}
`))
	if err != nil {
		t.Fatal(err)
	}
	// Profiles by name (both size 1); 3g.20gb's seats alternate GPUs,
	// 4g.20gb's single placements go to GPUs far apart.
	got := strings.Join(migDeviceNames(plan), " ")
	if !strings.HasPrefix(got, "g0-mig-3g-20gb-4 g1-mig-3g-20gb-4 g0-mig-3g-20gb-0 g1-mig-3g-20gb-0 g0-mig-4g-20gb-0 ") || len(plan.MIGDevices()) != 7 {
		t.Errorf("spread MIG devices: %s", got)
	}
}

func TestMIGPlanErrorsNameTheLine(t *testing.T) {
	tests := []struct {
		name, preset, config string
		want                 []string
	}{
		{"a MIG profile the model does not have", "dgx-h100", `profiles:
- resource: kyb.ai/mig-1g.5gb
  mig: {profile: 1g.5gb}
`, []string{`test.yaml:3: profiles[0].mig.profile: MIG profile "1g.5gb" is not one of H100-80GB's: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb`}},
		{"more seats than the model has instances", "dgx-a100", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig:
    profile: 1g.10gb
    seatsPerGPU: 5
`, []string{"test.yaml:5: profiles[0].mig.seatsPerGPU: 5 seats per GPU, but A100-40GB holds at most 4 instance(s) of 1g.10gb per GPU"}},
		{"a GPU without MIG", "pcie-8gpu", `profiles:
- resource: kyb.ai/gpu-1x-seat
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
  gpus: [0, 1]
`, []string{`test.yaml:4: profiles[1].mig.profile: MIG profile 1g.10gb on GPUs without MIG: GPU 0 (NVIDIA L40S), 1 (NVIDIA L40S)`}},
		{"one MIG profile twice on a GPU", "dgx-h100", `profiles:
- resource: kyb.ai/mig-a
  mig: {profile: 1g.10gb+me}
  gpus: [0, 1]
- resource: kyb.ai/mig-b
  mig: {profile: 1g.10gb+me}
  gpus: [1]
`, []string{"test.yaml:6: profiles[1].mig.profile: GPU 1 already offers 1g.10gb+me through profiles[0]"}},
		{"an overprovisioned profile on a MIG GPU", "dgx-h100", `profiles:
- resource: kyb.ai/gpu-1x-seat
  allowOverprovision: true
  seatsPerGroup: 2
  gpus: [6, 7]
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
  gpus: [7]
`, []string{"test.yaml:3: profiles[0].allowOverprovision: group G7 shares GPU 7 with MIG profile mig-1g-10gb (profiles[1])"}},
		{"device names that collide", "dgx-h100", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
- resource: kyb.ai/gpu-1x-seat
  name: mig-1g-10gb-6
`, []string{"device name g0-mig-1g-10gb-6 of MIG profile mig-1g-10gb is also that of group G0 of profile mig-1g-10gb-6"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, src, err := v1alpha1.LoadNodeConfig([]byte(tc.config), "test.yaml")
			if err != nil {
				t.Fatalf("the document itself is valid: %v", err)
			}
			_, err = planner.New(presetInventory(t, tc.preset), cfg)
			var fe v1alpha1.FieldErrors
			if !errors.As(err, &fe) {
				t.Fatalf("want field errors, got %v", err)
			}
			msg := src.Annotate(fe).Error()
			for _, want := range tc.want {
				if !strings.Contains(msg, want) {
					t.Errorf("error:\n%s\ndoes not say %q", msg, want)
				}
			}
		})
	}
}
