package planner_test

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// configs is a spread of configurations every property must hold under.
var configs = map[string]string{
	"defaults": "",
	"seats and overprovision": `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, allowOverprovision: true}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
- {resource: kyb.ai/gpu-4x-seat, seatsPerGroup: 2}
`,
	"spread with an 8x profile": `
allocationPolicy: spread
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-8x-seat}
`,
	"restricted profiles": `
profiles:
- {resource: kyb.ai/gpu-1x-seat, gpus: [0, 1, 2]}
- {resource: kyb.ai/gpu-2x-seat, gpus: [0, 1, 2, 3, 4]}
`,
	"custom profiles of one size": `
profiles:
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-2x-train, gpusPerGroup: 2, seatsPerGroup: 1}
`,
}

func checkPlanProperties(t *testing.T, plan *planner.Plan) {
	t.Helper()
	devices := map[string]bool{}
	for _, prof := range plan.Profiles {
		seen := map[int]string{}
		for _, g := range prof.Groups {
			if len(g.GPUs) != prof.Size {
				t.Errorf("profile %s: group %s has %d GPUs", prof.Name, g.Name, len(g.GPUs))
			}
			for _, x := range g.GPUs {
				if other, dup := seen[x]; dup {
					t.Errorf("profile %s: GPU %d is in groups %s and %s", prof.Name, x, other, g.Name)
				}
				seen[x] = g.Name
			}
			if devices[g.DeviceName()] {
				t.Errorf("device name %s used twice", g.DeviceName())
			}
			devices[g.DeviceName()] = true
		}
	}
	ordered := plan.Ordered()
	if len(ordered) != len(devices) {
		t.Errorf("ordered has %d groups, plan has %d", len(ordered), len(devices))
	}
	for _, g := range ordered {
		if !devices[g.DeviceName()] {
			t.Errorf("ordered has unknown group %s", g.DeviceName())
		}
		delete(devices, g.DeviceName())
	}
}

func TestPlanPropertiesOverPresetsAndConfigs(t *testing.T) {
	for _, preset := range simnode.Presets() {
		inv := presetInventory(t, preset)
		for name, text := range configs {
			t.Run(preset+"/"+name, func(t *testing.T) {
				var cfg *v1alpha1.NodeConfig
				if text != "" {
					cfg = loadConfig(t, text)
				}
				plan, err := planner.New(inv, cfg)
				if name == "restricted profiles" && len(inv.GPUs) < 5 {
					// The config names GPUs this node lacks.
					if err == nil || !strings.Contains(err.Error(), "profiles[1].gpus[4]: GPU 4 does not exist") {
						t.Fatalf("expected an error naming profiles[1].gpus[4], got %v", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				checkPlanProperties(t, plan)
				again, _ := planner.New(inv, cfg)
				if order(plan) != order(again) {
					t.Errorf("planning twice gave different plans")
				}
			})
		}
	}
}

// randomInventory builds a node of n GPUs with random NVLinks and a random
// (but consistent) PCIe tree.
func randomInventory(rng *rand.Rand, n int) *inventory.Inventory {
	inv := &inventory.Inventory{DriverVersion: "580.95.05"}
	sockets := 1 + rng.Intn(2)
	roots := sockets * (1 + rng.Intn(2))
	type place struct{ socket, root, sw int }
	places := make([]place, n)
	for i := range places {
		r := rng.Intn(roots)
		places[i] = place{socket: r % sockets, root: r, sw: r*4 + rng.Intn(2)}
		inv.GPUs = append(inv.GPUs, inventory.GPU{Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%d", i), NUMANode: places[i].socket, PCIeRoot: fmt.Sprintf("pci%04x:00", r)})
	}
	inv.Links = make([][]inventory.Link, n)
	for i := range inv.Links {
		inv.Links[i] = make([]inventory.Link, n)
	}
	density := rng.Float64()
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			var l inventory.Link
			switch a, b := places[i], places[j]; {
			case a.sw == b.sw:
				l.PCIe = inventory.PCIeSingleSwitch
			case a.root == b.root:
				l.PCIe = inventory.PCIeHostBridge
			case a.socket == b.socket:
				l.PCIe = inventory.PCIeNUMANode
			default:
				l.PCIe = inventory.PCIeSystem
			}
			if rng.Float64() < density {
				l.NVLinks = 1 + rng.Intn(4)
			}
			inv.Links[i][j], inv.Links[j][i] = l, l
		}
	}
	return inv
}

// allNVLinkPartitionExists answers, by plain enumeration, whether the GPUs
// can be split into floor(n/size) groups whose every pair has NVLink.
func allNVLinkPartitionExists(inv *inventory.Inventory, gpus []int, size, groups int) bool {
	if groups == 0 {
		return true
	}
	if len(gpus) < size*groups {
		return false
	}
	first, rest := gpus[0], gpus[1:]
	found := false
	var pick func(start int, chosen []int)
	pick = func(start int, chosen []int) {
		if found {
			return
		}
		if len(chosen) == size-1 {
			group := append([]int{first}, chosen...)
			for a := 0; a < len(group); a++ {
				for b := a + 1; b < len(group); b++ {
					if inv.Links[group[a]][group[b]].NVLinks == 0 {
						return
					}
				}
			}
			var remaining []int
			for _, x := range rest {
				if !slices.Contains(chosen, x) {
					remaining = append(remaining, x)
				}
			}
			if allNVLinkPartitionExists(inv, remaining, size, groups-1) {
				found = true
			}
			return
		}
		for i := start; i < len(rest); i++ {
			pick(i+1, append(chosen, rest[i]))
		}
	}
	pick(0, nil)
	// The first GPU may also be the one left over.
	if !found && len(gpus)-1 >= size*groups {
		found = allNVLinkPartitionExists(inv, rest, size, groups)
	}
	return found
}

func TestAutoGroupingPrefersAllNVLinkGroups(t *testing.T) {
	rng := rand.New(rand.NewSource(20261122))
	checked := 0
	for iter := 0; iter < 400; iter++ {
		n := 2 + rng.Intn(7) // 2..8 GPUs
		inv := randomInventory(rng, n)
		plan, err := planner.New(inv, loadConfig(t, `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-4x-seat}
`))
		if err != nil {
			t.Fatal(err)
		}
		checkPlanProperties(t, plan)
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		for _, prof := range plan.Profiles {
			if prof.Size == 1 {
				continue
			}
			if want := n / prof.Size; len(prof.Groups) != want {
				t.Errorf("iter %d: profile %s has %d groups on %d GPUs, want %d", iter, prof.Name, len(prof.Groups), n, want)
			}
			if !allNVLinkPartitionExists(inv, all, prof.Size, n/prof.Size) {
				continue
			}
			checked++
			for _, g := range prof.Groups {
				if g.Interconnect != inventory.ClassNVLink {
					t.Errorf("iter %d: an all-NVLink grouping of size %d exists, but group %s (%s) is %s", iter, prof.Size, g.Name, g.GPUList(), g.Interconnect)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d cases had an all-NVLink grouping; the generator no longer exercises the property", checked)
	}
}

// A 16-GPU node stays tractable and keeps the property on structured
// topologies (two NVSwitch-like islands of 8).
func TestAutoGroupingSixteenGPUs(t *testing.T) {
	n := 16
	inv := &inventory.Inventory{DriverVersion: "580.95.05"}
	for i := 0; i < n; i++ {
		inv.GPUs = append(inv.GPUs, inventory.GPU{Index: i, NUMANode: i / 8, PCIeRoot: fmt.Sprintf("pci%04x:00", i/4)})
	}
	inv.Links = make([][]inventory.Link, n)
	for i := range inv.Links {
		inv.Links[i] = make([]inventory.Link, n)
		for j := range inv.Links[i] {
			l := inventory.Link{PCIe: inventory.PCIeSystem}
			if i/8 == j/8 {
				l = inventory.Link{NVLinks: 12, PCIe: inventory.PCIeNUMANode}
			}
			if i/4 == j/4 {
				l.PCIe = inventory.PCIeHostBridge
			}
			inv.Links[i][j] = l
		}
	}
	plan, err := planner.New(inv, loadConfig(t, `
profiles: [{resource: kyb.ai/gpu-2x-seat}, {resource: kyb.ai/gpu-4x-seat}, {resource: kyb.ai/gpu-8x-seat}]
`))
	if err != nil {
		t.Fatal(err)
	}
	checkPlanProperties(t, plan)
	if got := plan.Profile("8x").Groups; len(got) != 2 || got[0].Name != "G0001020304050607" || got[1].Name != "G0809101112131415" {
		t.Errorf("8x groups %v", got)
	}
	if got := plan.Profile("4x").Groups; len(got) != 4 || got[1].GPUList() != "4,5,6,7" {
		t.Errorf("4x groups: second is %s, want 4,5,6,7 (one host bridge)", got[1].GPUList())
	}
}
