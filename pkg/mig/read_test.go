package mig_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// The names nvidia-smi mig -lgip prints, made from what the unversioned
// NVML call answers and the GPU's memory: those of a real H200, then the
// suffixes of the profile variants NVML's indices name.
func TestProfileNames(t *testing.T) {
	const h200 = 150754820096 // a real H200's NVML total
	for _, tt := range []struct {
		index, slices int
		memMiB        uint64
		want          string
	}{
		{0, 1, 16384, "1g.18gb"},
		{7, 1, 16384, "1g.18gb+me"},
		{9, 1, 33280, "1g.35gb"},
		{1, 2, 33280, "2g.35gb"},
		{2, 3, 71424, "3g.71gb"},
		{3, 4, 71424, "4g.71gb"},
		{4, 7, 143360, "7g.141gb"},
		{8, 2, 33280, "2g.35gb+me"},
		{10, 1, 16384, "1g.18gb+gfx"},
		{12, 4, 71424, "4g.71gb+gfx"},
		{13, 1, 16384, "1g.18gb-me"},
		{16, 2, 33280, "2g.35gb+me.all"},
	} {
		if got := mig.ProfileName(tt.index, tt.slices, tt.memMiB, h200); got != tt.want {
			t.Errorf("ProfileName(%d, %d, %d MiB) = %s, want %s", tt.index, tt.slices, tt.memMiB, got, tt.want)
		}
	}
}

// device is GPU gpu of a simulated node (a preset or a NodeTopology
// document), with its name and memory.
func device(t *testing.T, node *simnode.Node, gpu int) (nvml.Device, string, uint64) {
	t.Helper()
	dev, ret := node.NVML().DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	name, _ := dev.GetName()
	mem, _ := dev.GetMemoryInfo()
	return dev, name, mem.Total
}

func load(t *testing.T, spec string) *simnode.Node {
	t.Helper()
	if strings.Contains(spec, "\n") {
		path := filepath.Join(t.TempDir(), "topology.yaml")
		if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
		spec = path
	}
	node, err := simnode.Load(spec, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// Where NVML gives no geometry, Read says why, naming the call and its
// answer; a GPU without MIG is ErrNotCapable.
func TestReadSaysWhyThereIsNoGeometry(t *testing.T) {
	for _, tt := range []struct {
		name, spec string
		fault      *simnode.CallFault
		want       string
		notCapable bool
	}{
		{name: "a GPU without MIG", spec: "pcie-8gpu", want: "not MIG-capable: GetMigMode: ERROR_NOT_SUPPORTED", notCapable: true},
		{name: "GetMigMode fails", spec: "dgx-h200", fault: &simnode.CallFault{Call: simnode.CallGetMigMode, Nth: 1, Ret: nvml.ERROR_UNKNOWN},
			want: "GetMigMode: ERROR_UNKNOWN"},
		{name: "a profile call fails", spec: "dgx-h200", fault: &simnode.CallFault{Call: simnode.CallGetGpuInstanceProfileInfo, Nth: 3, Ret: nvml.ERROR_GPU_IS_LOST},
			want: "GetGpuInstanceProfileInfo(2): ERROR_GPU_IS_LOST"},
		{name: "a placements call fails", spec: "dgx-h200", fault: &simnode.CallFault{Call: simnode.CallGetGpuInstancePossiblePlacements, Nth: 2, Ret: nvml.ERROR_NO_PERMISSION},
			want: "GetGpuInstancePossiblePlacements(profile ID 14): ERROR_NO_PERMISSION"},
		{name: "a MIG GPU whose profiles NVML does not describe", spec: `gpus:
- {index: 0, productName: NVIDIA A30, architecture: ampere, cudaComputeCapability: "8.0", memoryMiB: 24576}
`, want: "no GPU-instance profile: GetGpuInstanceProfileInfo answered ERROR_NOT_SUPPORTED for every one"},
		{name: "instances on disjoint slices that take more compute slices than the GPU has", spec: `gpus:
- index: 0
  productName: NVIDIA Wide
  architecture: blackwell
  cudaComputeCapability: "10.0"
  memoryMiB: 40960
  mig:
    profiles:
    - {index: 1, id: 3, sliceCount: 2, instanceCount: 4, multiprocessorCount: 20, memorySizeMB: 10240, placements: {starts: [0, 1, 2, 3], size: 1}}
`, want: "the MIG geometry NVML gives cannot be published: instances on disjoint memory slices can take 8 compute slices of the GPU's 2, which memory-slice counters cannot keep apart"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			node := load(t, tt.spec)
			dev, name, mem := device(t, node, 0)
			if tt.fault != nil {
				if err := node.FailCall(*tt.fault); err != nil {
					t.Fatal(err)
				}
			}
			m, err := mig.Read(dev, name, mem)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Read = %d profiles, %v; want %q", len(m.Profiles), err, tt.want)
			}
			if errors.Is(err, mig.ErrNotCapable) != tt.notCapable {
				t.Errorf("errors.Is(ErrNotCapable) = %v, want %v", !tt.notCapable, tt.notCapable)
			}
		})
	}
}
