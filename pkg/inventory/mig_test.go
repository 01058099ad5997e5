package inventory_test

import (
	"context"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// Discovery reads every GPU's MIG geometry through NVML, or why it has
// none: a GPU without MIG, or one whose MIG calls fail, is a fact it
// records, never a failed discovery.
func TestDiscoveryReadsMIGGeometry(t *testing.T) {
	for _, tt := range []struct {
		name, preset string
		fault        *simnode.CallFault
		// gpu is the GPU the case is about; profiles its profiles' names
		// where it has a geometry, else noMIG and capable.
		gpu      int
		profiles string
		noMIG    string
		capable  bool
		// unprivileged runs discovery as a process that is not root and
		// holds no MIG capability.
		unprivileged bool
	}{
		{name: "an H200", preset: "dgx-h200", gpu: 5, capable: true,
			profiles: "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb"},
		{name: "an A100 40GB", preset: "dgx-a100", gpu: 0, capable: true,
			profiles: "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb"},
		{name: "a GPU without MIG", preset: "pcie-8gpu", gpu: 3, noMIG: "not MIG-capable: GetMigMode: ERROR_NOT_SUPPORTED"},
		{name: "GetMigMode fails", preset: "dgx-h100", gpu: 0, capable: true,
			fault: &simnode.CallFault{Call: simnode.CallGetMigMode, Nth: 1, Ret: nvml.ERROR_UNKNOWN},
			noMIG: "GetMigMode: ERROR_UNKNOWN"},
		{name: "a profile call fails", preset: "dgx-h100", gpu: 0, capable: true,
			fault: &simnode.CallFault{Call: simnode.CallGetGpuInstanceProfileInfo, Nth: 1, Ret: nvml.ERROR_UNKNOWN},
			noMIG: "GetGpuInstanceProfileInfo(0): ERROR_UNKNOWN"},
		{name: "a placements call fails", preset: "dgx-h100", gpu: 0, capable: true,
			fault: &simnode.CallFault{Call: simnode.CallGetGpuInstancePossiblePlacements, Nth: 7, Ret: nvml.ERROR_TIMEOUT},
			noMIG: "GetGpuInstancePossiblePlacements(profile ID 15): ERROR_TIMEOUT"},
		{name: "an unprivileged process", preset: "dgx-h100", gpu: 0, capable: true, unprivileged: true,
			noMIG: "GetGpuInstancePossiblePlacements(profile ID 19): ERROR_NO_PERMISSION"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sim, err := simnode.Load(tt.preset, "node-a")
			if err != nil {
				t.Fatal(err)
			}
			if tt.fault != nil {
				if err := sim.FailCall(*tt.fault); err != nil {
					t.Fatal(err)
				}
			}
			if tt.unprivileged {
				sim.SetProcessUID(1000)
				sim.DenyDevice("/dev/nvidia-caps/nvidia-cap1")
				sim.DenyDevice("/dev/nvidia-caps/nvidia-cap2")
			}
			inv, err := inventory.Discover(context.Background(), sim.NVML(), sim.PCIe())
			if err != nil {
				t.Fatalf("a GPU's MIG geometry must not fail discovery: %v", err)
			}
			g := inv.GPUs[tt.gpu]
			if g.MIGCapable != tt.capable {
				t.Errorf("GPU %d MIG-capable %v, want %v", tt.gpu, g.MIGCapable, tt.capable)
			}
			if tt.profiles != "" {
				if g.MIG == nil {
					t.Fatalf("GPU %d has no MIG geometry: %s", tt.gpu, g.NoMIG)
				}
				if got := strings.Join(g.MIG.ProfileNames(), " "); got != tt.profiles || g.MIG.Name != g.ProductName || g.NoMIG != "" {
					t.Errorf("GPU %d: %s's profiles %s (no MIG: %q), want %s's %s", tt.gpu, g.MIG.Name, got, g.NoMIG, g.ProductName, tt.profiles)
				}
				return
			}
			if g.MIG != nil || g.NoMIG != tt.noMIG {
				t.Errorf("GPU %d: geometry %v, reason %q; want none, %q", tt.gpu, g.MIG, g.NoMIG, tt.noMIG)
			}
			if tt.fault != nil && (inv.GPUs[1].MIG == nil || len(inv.GPUs[1].MIG.Profiles) != 7) {
				t.Errorf("GPU 1 lost its geometry to GPU 0's failed call: %v", inv.GPUs[1].NoMIG)
			}
			if len(inv.Warnings) != 0 {
				t.Errorf("warnings %q; a GPU without MIG geometry is said where a MIG profile is given it", inv.Warnings)
			}
		})
	}
}
