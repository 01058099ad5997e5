package v1alpha1

import (
	"strings"
	"testing"
)

const goodTopology = `apiVersion: kyb.ai/v1alpha1
kind: NodeTopology
defaults: {productName: NVIDIA L40S, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 46068}
gpus:
- {index: 0, nvlinks: [{peer: 1, links: 4}]}
- {index: 1, nvlinks: [{peer: 0, links: 4}]}
`

func TestTopologyDefaults(t *testing.T) {
	topo, err := LoadNodeTopology([]byte(goodTopology), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g := topo.GPUs[1]
	if g.ProductName != "NVIDIA L40S" || *g.Minor != 1 || g.PCIBusID != "0000:19:00.0" || *g.NUMANode != 0 || g.PCIeRoot != "pci0000:00" {
		t.Errorf("defaults not applied: %+v", g)
	}
	if topo.DriverVersion == "" || *topo.UVMMajor != 511 {
		t.Errorf("node defaults not applied: %+v", topo)
	}
}

func TestTopologyErrorsNameThePlace(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"asymmetric links", `gpus:
- {index: 0, productName: x, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 1, nvlinks: [{peer: 1, links: 4}]}
- {index: 1, productName: x, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 1, nvlinks: [{peer: 0, links: 2}]}
`, []string{"t.yaml:2: gpus[0].nvlinks[0]: GPU 0 lists 4 links to GPU 1, but GPU 1 lists 2 back; links are symmetric"}},
		{"one-sided link", `gpus:
- {index: 0, productName: x, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 1}
- {index: 1, productName: x, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 1, nvlinks: [{peer: 0, links: 2}]}
`, []string{"t.yaml:3: gpus[1].nvlinks[0]: GPU 1 lists 2 links to GPU 0, but GPU 0 lists none back"}},
		{"duplicate index and UUID", `defaults: {productName: x, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 1}
gpus:
- index: 0
  uuid: GPU-8d7a1c2e-0f4b-4c6e-9a1d-3b5f7e9c0a12
- index: 0
  uuid: GPU-8D7A1C2E-0F4B-4C6E-9A1D-3B5F7E9C0A12
`, []string{
			"t.yaml:5: gpus[1].index: index 0 is already used by gpus[0]",
			"t.yaml:6: gpus[1].uuid: UUID GPU-8D7A1C2E-0F4B-4C6E-9A1D-3B5F7E9C0A12 is already used by gpus[0]",
		}},
		{"unknown field", `gpus:
- {index: 0, productName: x, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 1, nvlink: []}
`, []string{"t.yaml:2: gpus[0].nvlink: unknown field"}},
		{"links to a missing GPU and too many ports", `nvswitch: {linksPerGPU: 18}
defaults: {productName: x, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 1}
gpus:
- {index: 0, nvlinks: [{peer: 3, links: 1}]}
- {index: 1, nvlinks: [{peer: 0, links: 1}]}
`, []string{
			"t.yaml:4: gpus[0].nvlinks[0].peer: GPU 3 does not exist on this node (2 GPUs)",
			"t.yaml:5: gpus[1].nvlinks: GPU 1 uses 19 NVLink ports in all (NVSwitch included); a GPU has at most 18",
		}},
		{"bad properties", `gpus:
- {index: 0, architecture: turbo, cudaComputeCapability: "9", pciBusID: "0000:1B:00.0", pcieRoot: root0}
`, []string{
			`gpus[0].architecture: unknown architecture "turbo"`,
			`gpus[0].cudaComputeCapability: "9" is not major.minor`,
			`gpus[0].pciBusID: "0000:1B:00.0" is not a PCI bus ID`,
			`gpus[0].pcieRoot: "root0" is not a PCIe root`,
			"gpus[0].productName: required (here or in defaults)",
			"gpus[0].memoryMiB: required (here or in defaults)",
		}},
		{"switch behind two roots", `defaults: {productName: x, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 1}
gpus:
- {index: 0, pcieRoot: pci0000:00, pcieSwitch: sw0}
- {index: 1, pcieRoot: pci0000:80, pcieSwitch: sw0}
`, []string{`t.yaml:4: gpus[1].pcieSwitch: switch "sw0" is behind root pci0000:00 on another GPU, not pci0000:80`}},
		{"no GPUs", "driverVersion: \"580.95.05\"\n", []string{"gpus: required"}},
		{"a MIG geometry with mistakes", `defaults:
  productName: x
  architecture: blackwell
  cudaComputeCapability: "10.0"
  memoryMiB: 1000
  mig:
    profiles:
    - {index: 0, id: 14, sliceCount: 1, instanceCount: 4, multiprocessorCount: 46, memorySizeMB: 240, placements: {starts: [0, 1, 1, 8], size: 1}}
    - index: 17
      id: 14
      sliceCount: 0
      instanceCount: 1
      multiprocessorCount: 94
      memorySizeMB: 480
      placements: {starts: [1], size: 2}
    - {index: 0, id: 3, sliceCount: 1, instanceCount: 1, multiprocessorCount: 1, memorySizeMB: 1, jpegCount: -1, placements: {starts: [0], size: 3}}
gpus:
- index: 0
  mig:
    profiles: []
- {index: 1, mig: {profiles: [{index: 0, id: 1, sliceCount: 1, instanceCount: 1, multiprocessorCount: 1, memorySizeMB: 1, placement: {starts: [0], size: 1}}]}}
`, []string{
			"t.yaml:8: defaults.mig.profiles[0].placements.starts[2]: start 1 is listed twice",
			"t.yaml:8: defaults.mig.profiles[0].placements.starts[3]: a placement of 1 slices at 8 does not lie on the 8 memory slices a simulated GPU has at most",
			"t.yaml:9: defaults.mig.profiles[1].index: must be an NVML_GPU_INSTANCE_PROFILE_* value between 0 and 16, not 17",
			"t.yaml:10: defaults.mig.profiles[1].id: ID 14 is already that of profiles[0]",
			"t.yaml:11: defaults.mig.profiles[1].sliceCount: must be at least 1, not 0",
			"t.yaml:15: defaults.mig.profiles[1].placements.starts[0]: a placement of 2 slices starts at a multiple of 2, not at 1",
			"t.yaml:16: defaults.mig.profiles[2].index: index 0 is already that of profiles[0]",
			"t.yaml:16: defaults.mig.profiles[2].jpegCount: must not be negative, not -1",
			"t.yaml:16: defaults.mig.profiles[2].placements.size: must be 1, 2, 4 or 8 memory slices, not 3",
			"t.yaml:20: gpus[0].mig.profiles: required: a MIG GPU has at least one GPU-instance profile",
			"t.yaml:21: gpus[1].mig.profiles[0].placement: unknown field",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadNodeTopology([]byte(tc.doc), "t.yaml")
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

func TestSeatConfig(t *testing.T) {
	cfg, err := DecodeSeatConfig([]byte(`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig","visibleDevices":"index"}`))
	if err != nil || cfg.VisibleDevices != VisibleDevicesIndex {
		t.Fatalf("got %+v, %v", cfg, err)
	}
	for raw, want := range map[string]string{
		`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig","visibleDevices":"all"}`: `visibleDevices: must be "uuid" or "index", not "all"`,
		`{"apiVersion":"kyb.ai/v1alpha1","kind":"GpuConfig"}`:                         `kind "GpuConfig" is not a configuration this driver knows`,
		`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig","sharing":{}}`:           `sharing: unknown field`,
		`{"visibleDevices":"uuid"}`:                                                   `apiVersion "", kind ""`,
	} {
		if _, err := DecodeSeatConfig([]byte(raw)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", raw, err, want)
		}
	}
}
