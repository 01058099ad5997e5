package planview_test

import (
	"bytes"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planview"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// A MIG profile's seats are instances on single GPUs, not whole-GPU
// groups: the plan says how many GPUs and seats it has and that MIG holds
// them, not "0 groups, time-slicing".
func TestMIGProfileInThePlan(t *testing.T) {
	_, inv := simnodetest.Inventory(t, "dgx-h100", "node-1")
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(`
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0, 1]}
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := planview.WriteTable(&out, "node-1", "simulated", inv, plan); err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "mig-1g-10gb ") {
			row = strings.Join(strings.Fields(l), " ")
		}
	}
	if want := "mig-1g-10gb kyb.ai/mig-1g.10gb 1 7 2 14 no mig 1g.10gb (GPUs 0,1)"; row != want {
		t.Errorf("the MIG profile's row:\n%q, want\n%q\n%s", row, want, out.String())
	}
	v := planview.NewView("node-1", "simulated", inv, plan)
	var mig *planview.ProfileView
	for i := range v.Profiles {
		if v.Profiles[i].MIG != "" {
			mig = &v.Profiles[i]
		}
	}
	if mig == nil || mig.MIG != "1g.10gb" || mig.Sharing != "mig" || mig.Seats != 14 || len(mig.MIGGPUs) != 2 ||
		mig.MIGGPUs[1] != (planview.MIGGPU{GPU: 1, Model: "NVIDIA H100 80GB HBM3", Seats: 7}) {
		t.Errorf("the MIG profile's view: %+v", mig)
	}
}

// A sized profile says so in the plan's table and view: its seats'
// sizes are asked by their claims, not an equal share.
func TestSizedProfileInThePlan(t *testing.T) {
	_, inv := simnodetest.Inventory(t, "dgx-h200", "node-1")
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(`
profiles:
- {resource: kyb.ai/gpu-1x-sized, seatsPerGroup: 8, gpus: [0], sharing: {strategy: mps, sized: true}}
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, gpus: [1], sharing: {strategy: mps}}
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := planview.WriteTable(&out, "node-1", "simulated", inv, plan); err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "1x") {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	if want := "1x-sized kyb.ai/gpu-1x-sized 1 8 1 8 no mps (sized)"; rows["1x-sized"] != want {
		t.Errorf("the sized profile's row %q, want %q", rows["1x-sized"], want)
	}
	if want := "1x kyb.ai/gpu-1x-seat 1 4 1 4 no mps"; rows["1x"] != want {
		t.Errorf("the equal-share profile's row %q, want %q", rows["1x"], want)
	}
	v := planview.NewView("node-1", "simulated", inv, plan)
	for _, p := range v.Profiles {
		if p.Sized != (p.Name == "1x-sized") {
			t.Errorf("profile %s in the view: sized %v", p.Name, p.Sized)
		}
	}
}
