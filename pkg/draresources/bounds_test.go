package draresources_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// The bounds on a node's pool are what the publisher itself publishes for
// the largest node: planner.MaxGPUs H100s on an NVSwitch, a profile of
// every size, its groups named, in the per-seat layout at the most seats
// and overprovisioned (every group kept). The shared layout, with every
// MIG profile of the H100 on every GPU at one seat (a seat counter for
// every profile of more placements), publishes less.
func TestTheLargestPoolIsWhatTheDriverPublishes(t *testing.T) {
	var doc strings.Builder
	doc.WriteString("nvswitch: {linksPerGPU: 18}\n")
	doc.WriteString(`defaults: {productName: NVIDIA H100 80GB HBM3, architecture: hopper, cudaComputeCapability: "9.0", memoryMiB: 81559}` + "\ngpus:\n")
	for i := range planner.MaxGPUs {
		fmt.Fprintf(&doc, "- {index: %d, pcieSwitch: sw%d}\n", i, i)
	}
	topo, err := v1alpha1.LoadNodeTopology([]byte(doc.String()), "largest node")
	if err != nil {
		t.Fatal(err)
	}
	sim := simnode.New(topo, "node-1")
	inv, err := inventory.Discover(context.Background(), sim.NVML(), sim.PCIe())
	if err != nil {
		t.Fatal(err)
	}
	model := inv.GPUs[0].MIG
	if model == nil {
		t.Fatalf("GPU 0 has no MIG geometry: %s", inv.GPUs[0].NoMIG)
	}
	var perSeat, shared strings.Builder
	perSeat.WriteString("profiles:\n")
	shared.WriteString("profiles:\n")
	for _, size := range v1alpha1.ValidGroupSizes {
		fmt.Fprintf(&perSeat, "- {resource: kyb.ai/gpu-%dx-seat, seatsPerGroup: %d, allowOverprovision: true}\n", size, v1alpha1.MaxSeatsPerGroup)
		fmt.Fprintf(&shared, "- {resource: kyb.ai/gpu-%dx-seat}\n", size)
	}
	for _, p := range model.Profiles {
		fmt.Fprintf(&shared, "- {resource: kyb.ai/mig-%s, mig: {profile: %q, seatsPerGPU: 1}}\n", strings.ReplaceAll(p.Name, "+", "-"), p.Name)
	}
	// The groups named, by index: the topology search over 32 GPUs takes
	// seconds and forms as many.
	var groups strings.Builder
	groups.WriteString("grouping: explicit\ngroups:\n")
	for _, size := range v1alpha1.ValidGroupSizes {
		for first := 0; first+size <= planner.MaxGPUs; first += size {
			gpus := make([]string, size)
			for i := range gpus {
				gpus[i] = fmt.Sprint(first + i)
			}
			fmt.Fprintf(&groups, "- {name: s%d-%d, gpus: [%s]}\n", size, first, strings.Join(gpus, ", "))
		}
	}
	perSeat.WriteString(groups.String())
	shared.WriteString(groups.String())
	most := map[string]int{}
	for _, tc := range []struct {
		layout      draresources.Layout
		config      string
		wantDevices int
		wantSlices  int
	}{
		{draresources.LayoutPerSeat, perSeat.String(), 7680, 120},
		{draresources.LayoutShared, shared.String(), 860, 17},
	} {
		cfg, _, err := v1alpha1.LoadNodeConfig([]byte(tc.config), "largest.yaml")
		if err != nil {
			t.Fatal(err)
		}
		plan, err := planner.New(inv, cfg)
		if err != nil {
			t.Fatal(err)
		}
		pool := draresources.Resources(plan, inv, "node-1", tc.layout).Pools["node-1"]
		devices := 0
		for _, s := range pool.Slices {
			devices += len(s.Devices)
		}
		t.Logf("%s layout: %d devices in %d slices", tc.layout, devices, len(pool.Slices))
		if devices != tc.wantDevices || len(pool.Slices) != tc.wantSlices {
			t.Errorf("%s layout: %d devices in %d slices, want %d in %d", tc.layout, devices, len(pool.Slices), tc.wantDevices, tc.wantSlices)
		}
		most["devices"] = max(most["devices"], devices)
		most["slices"] = max(most["slices"], len(pool.Slices))
	}
	if got := draresources.MaxPoolDevices(); got != most["devices"] {
		t.Errorf("MaxPoolDevices is %d, the largest pool published has %d devices", got, most["devices"])
	}
	if got := draresources.MaxPoolSlices(); got != most["slices"] {
		t.Errorf("MaxPoolSlices is %d, the largest pool published has %d slices", got, most["slices"])
	}
}
