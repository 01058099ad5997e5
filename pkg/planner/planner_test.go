package planner_test

import (
	"os"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

func presetInventory(t testing.TB, preset string) *inventory.Inventory {
	t.Helper()
	_, inv := simnodetest.Inventory(t, preset, "node-1")
	return inv
}

func loadConfig(t testing.TB, text string) *v1alpha1.NodeConfig {
	t.Helper()
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(text), "test.yaml")
	if err != nil {
		t.Fatalf("load config: %v", err)
	}
	return cfg
}

func seedConfig(t testing.TB) *v1alpha1.NodeConfig {
	t.Helper()
	data, err := os.ReadFile("../../api/kyb.ai/v1alpha1/testdata/seed-configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := v1alpha1.LoadNodeConfig(data, "seed-configmap.yaml")
	if err != nil {
		t.Fatalf("the seed's example config must be accepted as written: %v", err)
	}
	return cfg
}

// groupSpec is a group as a test expects it: "G01:0,1:nvlink".
type profileSpec struct {
	name   string
	seats  int
	groups []string
}

func describe(p *planner.Plan) []profileSpec {
	var out []profileSpec
	for _, prof := range p.Profiles {
		ps := profileSpec{name: prof.Name, seats: prof.SeatsPerGroup}
		for _, g := range prof.Groups {
			ps.groups = append(ps.groups, g.Name+":"+g.GPUList()+":"+g.Interconnect.String())
		}
		out = append(out, ps)
	}
	return out
}

func equalSpecs(a, b []profileSpec) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].name != b[i].name || a[i].seats != b[i].seats || strings.Join(a[i].groups, " ") != strings.Join(b[i].groups, " ") {
			return false
		}
	}
	return true
}

var eightOneX = []string{"G0:0:none", "G1:1:none", "G2:2:none", "G3:3:none", "G4:4:none", "G5:5:none", "G6:6:none", "G7:7:none"}

func TestPlanPresetsWithDefaultConfig(t *testing.T) {
	tests := []struct {
		preset string
		want   []profileSpec
	}{
		{"dgx-h100", []profileSpec{
			{"1x", 1, eightOneX},
			{"2x", 1, []string{"G01:0,1:nvlink", "G23:2,3:nvlink", "G45:4,5:nvlink", "G67:6,7:nvlink"}},
			{"4x", 1, []string{"G0123:0,1,2,3:nvlink", "G4567:4,5,6,7:nvlink"}},
		}},
		{"dgx-a100", []profileSpec{
			{"1x", 1, eightOneX},
			{"2x", 1, []string{"G01:0,1:nvlink", "G23:2,3:nvlink", "G45:4,5:nvlink", "G67:6,7:nvlink"}},
			{"4x", 1, []string{"G0123:0,1,2,3:nvlink", "G4567:4,5,6,7:nvlink"}},
		}},
		{"nvlink-2x4", []profileSpec{
			{"1x", 1, eightOneX},
			{"2x", 1, []string{"G01:0,1:nvlink", "G23:2,3:nvlink", "G45:4,5:nvlink", "G67:6,7:nvlink"}},
			{"4x", 1, []string{"G0123:0,1,2,3:nvlink", "G4567:4,5,6,7:nvlink"}},
		}},
		{"pcie-8gpu", []profileSpec{
			{"1x", 1, eightOneX},
			{"2x", 1, []string{"G01:0,1:pcie-switch", "G23:2,3:pcie-switch", "G45:4,5:pcie-switch", "G67:6,7:pcie-switch"}},
			{"4x", 1, []string{"G0123:0,1,2,3:host-bridge", "G4567:4,5,6,7:host-bridge"}},
		}},
		{"workstation-2gpu", []profileSpec{
			{"1x", 1, []string{"G0:0:none", "G1:1:none"}},
			{"2x", 1, []string{"G01:0,1:host-bridge"}},
		}},
		{"single-gpu", []profileSpec{
			{"1x", 1, []string{"G0:0:none"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.preset, func(t *testing.T) {
			plan, err := planner.New(presetInventory(t, tc.preset), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := describe(plan); !equalSpecs(got, tc.want) {
				t.Errorf("plan:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// The seed's example: 1x with 4 seats, 2x with 3 seats, G01 and G23 named;
// the 2x profile derives its other groups from the topology.
func TestPlanPresetsWithSeedConfig(t *testing.T) {
	tests := []struct {
		preset string
		want   []profileSpec
		err    []string
	}{
		{preset: "dgx-h100", want: []profileSpec{
			{"1x", 4, eightOneX},
			{"2x", 3, []string{"G01:0,1:nvlink", "G23:2,3:nvlink", "G45:4,5:nvlink", "G67:6,7:nvlink"}},
		}},
		{preset: "nvlink-2x4", want: []profileSpec{
			{"1x", 4, eightOneX},
			{"2x", 3, []string{"G01:0,1:nvlink", "G23:2,3:nvlink", "G45:4,5:nvlink", "G67:6,7:nvlink"}},
		}},
		{preset: "pcie-8gpu", want: []profileSpec{
			{"1x", 4, eightOneX},
			{"2x", 3, []string{"G01:0,1:pcie-switch", "G23:2,3:pcie-switch", "G45:4,5:pcie-switch", "G67:6,7:pcie-switch"}},
		}},
		{preset: "workstation-2gpu", err: []string{
			"groups[1].gpus[0]: GPU 2 does not exist on this node (2 GPUs)",
			"groups[1].gpus[1]: GPU 3 does not exist on this node (2 GPUs)",
		}},
		{preset: "single-gpu", err: []string{
			"groups[0].gpus[1]: GPU 1 does not exist on this node (1 GPU)",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.preset, func(t *testing.T) {
			plan, err := planner.New(presetInventory(t, tc.preset), seedConfig(t))
			if tc.err != nil {
				if err == nil {
					t.Fatal("expected an error")
				}
				for _, want := range tc.err {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := describe(plan); !equalSpecs(got, tc.want) {
				t.Errorf("plan:\n got %+v\nwant %+v", got, tc.want)
			}
			g01 := plan.Profile("2x").Groups[0]
			if !g01.Explicit || plan.Profile("2x").Groups[2].Explicit {
				t.Errorf("G01 must be explicit and G45 derived")
			}
		})
	}
}

func order(p *planner.Plan) string {
	var names []string
	for _, g := range p.Ordered() {
		names = append(names, g.DeviceName())
	}
	return strings.Join(names, " ")
}

func TestOrderPackAndSpread(t *testing.T) {
	inv := presetInventory(t, "dgx-h100")
	pack, err := planner.New(inv, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantPack := "g0-1x g1-1x g2-1x g3-1x g4-1x g5-1x g6-1x g7-1x g01-2x g23-2x g45-2x g67-2x g0123-4x g4567-4x"
	if got := order(pack); got != wantPack {
		t.Errorf("pack order:\n got %s\nwant %s", got, wantPack)
	}
	spread, err := planner.New(inv, loadConfig(t, "allocationPolicy: spread\n"))
	if err != nil {
		t.Fatal(err)
	}
	// Farthest first: the other socket, then the other host bridge, then
	// the sibling.
	wantSpread := "g0-1x g4-1x g2-1x g6-1x g1-1x g3-1x g5-1x g7-1x g01-2x g45-2x g23-2x g67-2x g0123-4x g4567-4x"
	if got := order(spread); got != wantSpread {
		t.Errorf("spread order:\n got %s\nwant %s", got, wantSpread)
	}
}

// With explicit grouping, GPUs 4-7 belong to no 2x group, so a pack policy
// puts their 1x seats first: a seat there breaks no larger group.
func TestPackPrefersGPUsOutsideLargerGroups(t *testing.T) {
	cfg := loadConfig(t, `
grouping: explicit
profiles:
- resource: kyb.ai/gpu-1x-seat
- resource: kyb.ai/gpu-2x-seat
groups:
- {name: G0, gpus: [0]}
- {name: G1, gpus: [1]}
- {name: G4, gpus: [4]}
- {name: G5, gpus: [5]}
- {name: G01, gpus: [0, 1]}
`)
	plan, err := planner.New(presetInventory(t, "dgx-h100"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := order(plan), "g4-1x g5-1x g0-1x g1-1x g01-2x"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
}

func TestExclusiveLayout(t *testing.T) {
	tests := []struct {
		name   string
		preset string
		config string
		want   []profileSpec
	}{
		{"defaults on 8 GPUs", "dgx-h100", "", []profileSpec{
			{"1x", 1, []string{"G6:6:none", "G7:7:none"}},
			{"2x", 1, []string{"G45:4,5:nvlink"}},
			{"4x", 1, []string{"G0123:0,1,2,3:nvlink"}},
		}},
		{"seed config", "nvlink-2x4", "seed", []profileSpec{
			{"1x", 4, []string{"G4:4:none", "G5:5:none", "G6:6:none", "G7:7:none"}},
			{"2x", 3, []string{"G01:0,1:nvlink", "G23:2,3:nvlink"}},
		}},
		{"two GPUs: the smaller profile is not starved", "workstation-2gpu", "", []profileSpec{
			{"1x", 1, []string{"G0:0:none", "G1:1:none"}},
			{"2x", 1, nil},
		}},
		{"gpus lists decide", "dgx-h100", `
profiles:
- {resource: kyb.ai/gpu-1x-seat, gpus: [0, 1, 2, 3, 4, 5]}
- {resource: kyb.ai/gpu-2x-seat, gpus: [6, 7]}
`, []profileSpec{
			{"1x", 1, []string{"G0:0:none", "G1:1:none", "G2:2:none", "G3:3:none", "G4:4:none", "G5:5:none"}},
			{"2x", 1, []string{"G67:6,7:nvlink"}},
		}},
		{"overprovisioned profiles keep every group", "dgx-h100", `
profiles:
- {resource: kyb.ai/gpu-1x-seat, allowOverprovision: true}
- {resource: kyb.ai/gpu-2x-seat}
`, []profileSpec{
			{"1x", 1, eightOneX},
			{"2x", 1, []string{"G01:0,1:nvlink", "G23:2,3:nvlink", "G45:4,5:nvlink", "G67:6,7:nvlink"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var cfg *v1alpha1.NodeConfig
			switch tc.config {
			case "":
			case "seed":
				cfg = seedConfig(t)
			default:
				cfg = loadConfig(t, tc.config)
			}
			plan, err := planner.New(presetInventory(t, tc.preset), cfg)
			if err != nil {
				t.Fatal(err)
			}
			layout, why := plan.ExclusiveLayout()
			if got := describe(layout); !equalSpecs(got, tc.want) {
				t.Errorf("layout:\n got %+v\nwant %+v", got, tc.want)
			}
			if why == "" {
				t.Error("the layout must come with its reason")
			}
			for _, a := range layout.Groups() {
				for _, b := range layout.Groups() {
					if a.Excludes(b) {
						t.Errorf("exclusive layout keeps %s and %s, which exclude each other", a.DeviceName(), b.DeviceName())
					}
				}
			}
		})
	}
}

func TestPlanErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name   string
		config string
		want   []string
	}{
		{"GPU that does not exist", `
profiles: [{resource: kyb.ai/gpu-2x-seat}]
groups: [{name: G89, gpus: [8, 9]}]
`, []string{"groups[0].gpus[0]: GPU 8 does not exist on this node (8 GPUs)", "groups[0].gpus[1]: GPU 9 does not exist on this node (8 GPUs)"}},
		{"group of a size no profile has", `
profiles: [{resource: kyb.ai/gpu-1x-seat}]
groups: [{name: G01, gpus: [0, 1]}]
`, []string{"groups[0].gpus: 2 GPUs, but no profile has groups of 2 (profiles: 1x=1)"}},
		{"overlapping groups of one size", `
profiles: [{resource: kyb.ai/gpu-2x-seat}]
groups:
- {name: G01, gpus: [0, 1]}
- {name: G12, gpus: [1, 2]}
`, []string{"groups[1].gpus[0]: GPU 1 is already in group G01; groups of one size must not overlap"}},
		{"profile GPU list beyond the node", `
profiles: [{resource: kyb.ai/gpu-1x-seat, gpus: [0, 12]}]
`, []string{"profiles[0].gpus[1]: GPU 12 does not exist on this node (8 GPUs)"}},
		{"explicit name that is another group's automatic name", `
profiles: [{resource: kyb.ai/gpu-2x-seat}]
groups: [{name: G45, gpus: [0, 1]}]
`, []string{`group "G45" is also the automatic name of GPUs [4 5] in profile 2x; rename it`}},
	}
	inv := presetInventory(t, "dgx-h100")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := planner.New(inv, loadConfig(t, tc.config))
			if err == nil {
				t.Fatal("expected an error")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error:\n%s\ndoes not say %q", err, want)
				}
			}
		})
	}
}

func TestGroupingExplicitUsesOnlyNamedGroups(t *testing.T) {
	plan, err := planner.New(presetInventory(t, "nvlink-2x4"), loadConfig(t, `
grouping: explicit
profiles: [{resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 2}]
groups: [{name: train, gpus: [5, 4]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []profileSpec{{"2x", 2, []string{"train:4,5:nvlink"}}}
	if got := describe(plan); !equalSpecs(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := plan.Profile("2x").Groups[0].DeviceName(); got != "train-2x" {
		t.Errorf("device name %s, want train-2x", got)
	}
}

func TestProfileThatTheNodeCannotFormIsAWarning(t *testing.T) {
	plan, err := planner.New(presetInventory(t, "workstation-2gpu"), loadConfig(t, `
profiles: [{resource: kyb.ai/gpu-1x-seat}, {resource: kyb.ai/gpu-4x-seat}]
`))
	if err != nil {
		t.Fatalf("a profile a node cannot form must not fail the node: %v", err)
	}
	if n := len(plan.Profile("4x").Groups); n != 0 {
		t.Errorf("4x has %d groups on 2 GPUs", n)
	}
	if len(plan.Warnings) != 1 || !strings.Contains(plan.Warnings[0], "profile 4x has no groups") {
		t.Errorf("warnings %q", plan.Warnings)
	}
}

func TestOverlaps(t *testing.T) {
	plan, err := planner.New(presetInventory(t, "dgx-h100"), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := plan.Overlaps()
	if want := "g0-1x g1-1x g0123-4x"; strings.Join(got["g01-2x"], " ") != want {
		t.Errorf("g01-2x overlaps %v, want %s", got["g01-2x"], want)
	}
	if want := "g45-2x g4567-4x"; strings.Join(got["g4-1x"], " ") != want {
		t.Errorf("g4-1x overlaps %v, want %s", got["g4-1x"], want)
	}
}
