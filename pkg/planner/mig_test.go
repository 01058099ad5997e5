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
	if len(small.MIG.GPUs) != 1 || small.MIG.GPUs[0].Index() != 0 || small.MIG.GPUs[0].Seats != 7 || small.MIG.GPUs[0].Model.Name != "NVIDIA H100 80GB HBM3" || small.MIG.GPUs[0].Profile.ID != 19 {
		t.Errorf("1g.10gb: %+v, want GPU 0 of an NVIDIA H100 80GB HBM3 with 7 seats of profile ID 19", small.MIG.GPUs[0])
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
	if m := plan.MIGModels(); len(m) != 3 || m[2].Name != "NVIDIA H100 80GB HBM3" {
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
`, []string{`test.yaml:3: profiles[0].mig.profile: MIG profile "1g.5gb" is not one of NVIDIA H100 80GB HBM3's: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb`}},
		{"an H100's profile on an H200", "dgx-h200", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig: {profile: 1g.10gb}
`, []string{`test.yaml:3: profiles[0].mig.profile: MIG profile "1g.10gb" is not one of NVIDIA H200's: 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb`}},
		{"more seats than the model has instances", "dgx-a100", `profiles:
- resource: kyb.ai/mig-1g.10gb
  mig:
    profile: 1g.10gb
    seatsPerGPU: 5
`, []string{"test.yaml:5: profiles[0].mig.seatsPerGPU: 5 seats per GPU, but NVIDIA A100-SXM4-40GB holds at most 4 instance(s) of 1g.10gb per GPU"}},
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

// On a DGX H200 the MIG geometry is the H200's as NVML gives it: its
// smallest profile, 1g.18gb, is seven seats per GPU, at the seven
// single-slice placements.
func TestMIGSeatsOnAnH200(t *testing.T) {
	plan, err := planner.New(presetInventory(t, "dgx-h200"), loadConfig(t, `
profiles:
- {resource: kyb.ai/mig-1g.18gb, mig: {profile: 1g.18gb}}
- {resource: kyb.ai/mig-3g.71gb, mig: {profile: 3g.71gb}, gpus: [7]}
`))
	if err != nil {
		t.Fatal(err)
	}
	small := plan.Profile("mig-1g-18gb")
	if small == nil || small.MIG == nil || len(small.MIG.GPUs) != 8 {
		t.Fatalf("1g.18gb: %+v, want MIG seats on 8 GPUs", small)
	}
	for _, g := range small.MIG.GPUs {
		if g.Seats != 7 || g.Profile.ID != 19 || g.Profile.MemoryMiB != 16384 || g.Model.Name != "NVIDIA H200" || len(g.Profile.Placements) != 7 {
			t.Errorf("GPU %d: %d seats of profile ID %d (%d MiB) of %s over %d placements; want 7 of ID 19 (16384 MiB) of NVIDIA H200 over 7",
				g.Index(), g.Seats, g.Profile.ID, g.Profile.MemoryMiB, g.Model.Name, len(g.Profile.Placements))
		}
	}
	if small.Seats() != 56 || small.SeatsPerGroup != 7 {
		t.Errorf("1g.18gb: %d seats, %d per GPU; want 56, 7", small.Seats(), small.SeatsPerGroup)
	}
	if big := plan.Profile("mig-3g-71gb"); big == nil || big.Seats() != 2 {
		t.Errorf("3g.71gb on GPU 7: %+v, want 2 seats", big)
	}
	want := "g7-mig-3g-71gb-4 g7-mig-3g-71gb-0"
	if got := strings.Join(migDeviceNames(plan), " "); !strings.HasSuffix(got, want) || !strings.HasPrefix(got, "g0-mig-1g-18gb-6 g0-mig-1g-18gb-5 ") {
		t.Errorf("MIG devices %s; want GPU 0's 1g.18gb from slice 6 down first, 3g.71gb on GPU 7 last", got)
	}
	if len(plan.Warnings) != 0 || len(plan.MIGUnavailable()) != 0 {
		t.Errorf("warnings %q, unavailable %v; want none", plan.Warnings, plan.MIGUnavailable())
	}
}

// A MIG profile on GPUs NVML gives no MIG geometry for is no error: one
// configuration serves every node of a fleet, so such a GPU publishes no
// MIG device, keeps its whole-GPU groups, and the plan says why.
func TestMIGProfileOnGPUsWithoutGeometryIsAWarning(t *testing.T) {
	plan, err := planner.New(presetInventory(t, "pcie-8gpu"), loadConfig(t, `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0, 1]}
`))
	if err != nil {
		t.Fatalf("a MIG profile on GPUs without MIG must not fail the node: %v", err)
	}
	prof := plan.Profile("mig-1g-10gb")
	if prof == nil || len(prof.MIG.GPUs) != 0 || prof.Seats() != 0 || len(plan.MIGDevices()) != 0 {
		t.Fatalf("1g.10gb on L40S GPUs: %+v, want no GPU and no device", prof)
	}
	if n := len(plan.Profile("1x").Groups); n != 8 {
		t.Errorf("%d 1x groups, want 8: the GPUs serve their groups as before", n)
	}
	want := "profile mig-1g-10gb (MIG 1g.10gb): GPU 0, 1 (NVIDIA L40S) publish no MIG device, as NVML gives no MIG geometry for them (not MIG-capable: GetMigMode: ERROR_NOT_SUPPORTED); restrict the profile with gpus to silence this"
	if len(plan.Warnings) != 1 || plan.Warnings[0] != want {
		t.Errorf("warnings %q, want [%q]", plan.Warnings, want)
	}
	u := plan.MIGUnavailable()
	if len(u) != 2 || u[0].GPU != 0 || u[1].GPU != 1 || u[0].Capable || len(u[0].Profiles) != 1 || u[0].Profiles[0] != "mig-1g-10gb" {
		t.Errorf("unavailable %+v, want GPUs 0 and 1, not MIG-capable, of mig-1g-10gb", u)
	}
}
