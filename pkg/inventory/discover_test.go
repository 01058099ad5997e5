package inventory_test

import (
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

func discover(t *testing.T, preset string) *inventory.Inventory {
	t.Helper()
	_, inv := simnodetest.Inventory(t, preset, "node-a")
	return inv
}

// The discovery code is the one that runs on real nodes; these tests drive
// it through the simulated NVML and check what it reads back against the
// presets' descriptions, written out by hand.
func TestDiscoverPresetIdentity(t *testing.T) {
	tests := []struct {
		preset    string
		gpus      int
		product   string
		arch      string
		cc        string
		memoryMiB int64
		driver    string
		cuda      string
	}{
		{"dgx-h100", 8, "NVIDIA H100 80GB HBM3", "hopper", "9.0", 81559, "580.95.05", "13.0"},
		{"dgx-h200", 8, "NVIDIA H200", "hopper", "9.0", 143771, "580.159.04", "13.0"},
		{"dgx-a100", 8, "NVIDIA A100-SXM4-40GB", "ampere", "8.0", 40960, "570.172.08", "12.8"},
		{"nvlink-2x4", 8, "NVIDIA A100-SXM4-80GB", "ampere", "8.0", 81920, "570.172.08", "12.8"},
		{"pcie-8gpu", 8, "NVIDIA L40S", "ada", "8.9", 46068, "580.95.05", "13.0"},
		{"workstation-2gpu", 2, "NVIDIA RTX 6000 Ada Generation", "ada", "8.9", 49140, "580.95.05", "13.0"},
		{"single-gpu", 1, "NVIDIA L4", "ada", "8.9", 23034, "580.95.05", "13.0"},
	}
	for _, tc := range tests {
		t.Run(tc.preset, func(t *testing.T) {
			inv := discover(t, tc.preset)
			if len(inv.GPUs) != tc.gpus {
				t.Fatalf("got %d GPUs, want %d", len(inv.GPUs), tc.gpus)
			}
			if inv.DriverVersion != tc.driver || inv.CUDADriverVersion != tc.cuda {
				t.Errorf("driver %s CUDA %s, want %s / %s", inv.DriverVersion, inv.CUDADriverVersion, tc.driver, tc.cuda)
			}
			uuids := map[string]bool{}
			for i, g := range inv.GPUs {
				if g.Index != i || g.Minor != i {
					t.Errorf("GPU %d: index %d minor %d", i, g.Index, g.Minor)
				}
				if g.ProductName != tc.product || g.Architecture != tc.arch || g.CUDAComputeCapability != tc.cc || g.MemoryMiB != tc.memoryMiB {
					t.Errorf("GPU %d: %+v", i, g)
				}
				if uuids[g.UUID] || len(g.UUID) != 40 {
					t.Errorf("GPU %d: bad or duplicate UUID %q", i, g.UUID)
				}
				uuids[g.UUID] = true
				if g.PCIeRoot == "" || g.NUMANode < 0 {
					t.Errorf("GPU %d: PCIe root %q NUMA %d", i, g.PCIeRoot, g.NUMANode)
				}
			}
		})
	}
}

func TestDiscoverLinks(t *testing.T) {
	type pair struct{ a, b int }
	tests := []struct {
		preset string
		want   map[pair]inventory.Link
	}{
		{"dgx-h100", map[pair]inventory.Link{
			{0, 1}: {NVLinks: 18, PCIe: inventory.PCIeHostBridge},
			{0, 2}: {NVLinks: 18, PCIe: inventory.PCIeNUMANode},
			{0, 7}: {NVLinks: 18, PCIe: inventory.PCIeSystem},
			{6, 7}: {NVLinks: 18, PCIe: inventory.PCIeHostBridge},
		}},
		{"dgx-a100", map[pair]inventory.Link{
			{0, 1}: {NVLinks: 12, PCIe: inventory.PCIeSingleSwitch},
			{1, 2}: {NVLinks: 12, PCIe: inventory.PCIeNUMANode},
			{3, 4}: {NVLinks: 12, PCIe: inventory.PCIeSystem},
		}},
		{"nvlink-2x4", map[pair]inventory.Link{
			{0, 1}: {NVLinks: 4, PCIe: inventory.PCIeSingleSwitch},
			{0, 3}: {NVLinks: 4, PCIe: inventory.PCIeHostBridge},
			{3, 4}: {NVLinks: 0, PCIe: inventory.PCIeSystem},
			{5, 7}: {NVLinks: 4, PCIe: inventory.PCIeHostBridge},
		}},
		{"pcie-8gpu", map[pair]inventory.Link{
			{0, 1}: {NVLinks: 0, PCIe: inventory.PCIeSingleSwitch},
			{1, 2}: {NVLinks: 0, PCIe: inventory.PCIeHostBridge},
			{0, 4}: {NVLinks: 0, PCIe: inventory.PCIeSystem},
		}},
		{"workstation-2gpu", map[pair]inventory.Link{
			{0, 1}: {NVLinks: 0, PCIe: inventory.PCIeHostBridge},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.preset, func(t *testing.T) {
			inv := discover(t, tc.preset)
			for p, want := range tc.want {
				if got := inv.Link(p.a, p.b); got != want {
					t.Errorf("link %d-%d = %+v, want %+v", p.a, p.b, got, want)
				}
				if got := inv.Link(p.b, p.a); got != want {
					t.Errorf("link %d-%d (reverse) = %+v, want %+v", p.b, p.a, got, want)
				}
			}
		})
	}
}

func TestDistinctNodesGetDistinctUUIDs(t *testing.T) {
	_, invA := simnodetest.Inventory(t, "single-gpu", "node-a")
	_, invB := simnodetest.Inventory(t, "single-gpu", "node-b")
	if invA.GPUs[0].UUID == invB.GPUs[0].UUID {
		t.Fatalf("two simulated nodes share GPU UUID %s", invA.GPUs[0].UUID)
	}
}

func TestNormalizeBusID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"00000000:18:00.0", "0000:18:00.0"},
		{"0000:1B:00.0", "0000:1b:00.0"},
		{"00000001:c3:00.1", "0001:c3:00.1"},
	}
	for _, tc := range tests {
		got, err := inventory.NormalizeBusID(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("NormalizeBusID(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "18:00.0", "zz:18:00.0"} {
		if _, err := inventory.NormalizeBusID(bad); err == nil {
			t.Errorf("NormalizeBusID(%q) accepted a malformed ID", bad)
		}
	}
}
