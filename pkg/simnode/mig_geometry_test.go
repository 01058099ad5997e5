package simnode

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// row writes a profile as a line of `nvidia-smi mig -lgip` and -lgipp
// would tell it: NVML index, ID, name, memory and compute slices, MiB,
// SMs, copy engines, decoders, JPEG decoders, OFAs, maximum, placements.
func row(p mig.Profile) string {
	starts := make([]string, 0, len(p.Placements))
	for _, pl := range p.Placements {
		starts = append(starts, fmt.Sprint(pl.Start))
	}
	return fmt.Sprintf("%d %d %s m%d c%d %dMiB %dSM ce%d dec%d enc%d jpeg%d ofa%d max%d {%s}:%d", p.Index, p.ID, p.Name, p.MemorySlices, p.ComputeSlices,
		p.MemoryMiB, p.SMs, p.CopyEngines, p.Decoders, p.Encoders, p.JPEGs, p.OFAs, p.MaxInstances, strings.Join(starts, ","), p.MemorySlices)
}

func rows(m mig.Model) string {
	var out []string
	for _, p := range m.Profiles {
		out = append(out, row(p))
	}
	return strings.Join(out, "\n")
}

// The H200's geometry, read through NVML from the simulated node, is what
// a real H200 answered (driver 580.159.04, MIG mode off), written out by
// hand from those answers and nvidia-smi mig -lgip/-lgipp.
func TestH200GeometryIsTheRealOne(t *testing.T) {
	_, d, m := gpu0(t, "dgx-h200")
	want := strings.Join([]string{
		"0 19 1g.18gb m1 c1 16384MiB 16SM ce1 dec1 enc0 jpeg1 ofa0 max7 {0,1,2,3,4,5,6}:1",
		"7 20 1g.18gb+me m1 c1 16384MiB 16SM ce1 dec1 enc0 jpeg1 ofa1 max1 {0,1,2,3,4,5,6}:1",
		"9 15 1g.35gb m2 c1 33280MiB 26SM ce1 dec1 enc0 jpeg1 ofa0 max4 {0,2,4,6}:2",
		"1 14 2g.35gb m2 c2 33280MiB 32SM ce2 dec2 enc0 jpeg2 ofa0 max3 {0,2,4}:2",
		"2 9 3g.71gb m4 c3 71424MiB 60SM ce3 dec3 enc0 jpeg3 ofa0 max2 {0,4}:4",
		"3 5 4g.71gb m4 c4 71424MiB 64SM ce4 dec4 enc0 jpeg4 ofa0 max1 {0}:4",
		"4 0 7g.141gb m8 c7 143360MiB 132SM ce8 dec7 enc0 jpeg7 ofa1 max1 {0}:8",
	}, "\n")
	if got := rows(m); got != want {
		t.Errorf("H200 geometry:\n%s\nwant:\n%s", got, want)
	}
	if m.Name != "NVIDIA H200" || m.MemorySlices != 8 || m.ComputeSlices != 7 {
		t.Errorf("%s: %d memory and %d compute slices, want NVIDIA H200, 8 and 7", m.Name, m.MemorySlices, m.ComputeSlices)
	}
	mem, _ := d.GetMemoryInfo()
	if mem.Total != 150754820096 {
		t.Errorf("memory %d bytes, want the real H200's 150754820096", mem.Total)
	}
	// Indices 0-4, 7 and 9 answer, the other indices below
	// NVML_GPU_INSTANCE_PROFILE_COUNT are not supported, and from it on
	// the index is invalid, as on the real GPU.
	for index := range 20 {
		_, ret := d.GetGpuInstanceProfileInfo(index)
		want := nvml.ERROR_NOT_SUPPORTED
		switch {
		case slices.Contains([]int{0, 1, 2, 3, 4, 7, 9}, index):
			want = nvml.SUCCESS
		case index >= 17:
			want = nvml.ERROR_INVALID_ARGUMENT
		}
		if ret != want {
			t.Errorf("GetGpuInstanceProfileInfo(%d) = %v, want %v", index, ret, want)
		}
	}
}

// Read through NVML, every table's geometry is the table: what the
// simulated node keeps its instances by is what the plugin reads, and
// the names the plugin makes are those nvidia-smi prints.
func TestGeometryReadThroughNVMLIsTheTable(t *testing.T) {
	for _, tc := range []struct{ preset, model, want string }{
		{"dgx-a100", "A100-40GB", `0 19 1g.5gb m1 c1 4864MiB 14SM ce1 dec0 enc0 jpeg0 ofa0 max7 {0,1,2,3,4,5,6}:1
7 20 1g.5gb+me m1 c1 4864MiB 14SM ce1 dec1 enc0 jpeg1 ofa1 max1 {0,1,2,3,4,5,6}:1
9 15 1g.10gb m2 c1 9856MiB 14SM ce1 dec1 enc0 jpeg0 ofa0 max4 {0,2,4,6}:2
1 14 2g.10gb m2 c2 9856MiB 28SM ce2 dec1 enc0 jpeg0 ofa0 max3 {0,2,4}:2
2 9 3g.20gb m4 c3 19968MiB 42SM ce3 dec2 enc0 jpeg0 ofa0 max2 {0,4}:4
3 5 4g.20gb m4 c4 19968MiB 56SM ce4 dec2 enc0 jpeg0 ofa0 max1 {0}:4
4 0 7g.40gb m8 c7 40192MiB 98SM ce7 dec5 enc0 jpeg1 ofa1 max1 {0}:8`},
		{"nvlink-2x4", "A100-80GB", `0 19 1g.10gb m1 c1 9728MiB 14SM ce1 dec0 enc0 jpeg0 ofa0 max7 {0,1,2,3,4,5,6}:1
7 20 1g.10gb+me m1 c1 9728MiB 14SM ce1 dec1 enc0 jpeg1 ofa1 max1 {0,1,2,3,4,5,6}:1
9 15 1g.20gb m2 c1 19968MiB 14SM ce1 dec1 enc0 jpeg0 ofa0 max4 {0,2,4,6}:2
1 14 2g.20gb m2 c2 19968MiB 28SM ce2 dec1 enc0 jpeg0 ofa0 max3 {0,2,4}:2
2 9 3g.40gb m4 c3 40192MiB 42SM ce3 dec2 enc0 jpeg0 ofa0 max2 {0,4}:4
3 5 4g.40gb m4 c4 40192MiB 56SM ce4 dec2 enc0 jpeg0 ofa0 max1 {0}:4
4 0 7g.80gb m8 c7 80896MiB 98SM ce7 dec5 enc0 jpeg1 ofa1 max1 {0}:8`},
		{"dgx-h100", "H100-80GB", `0 19 1g.10gb m1 c1 9984MiB 16SM ce1 dec1 enc0 jpeg1 ofa0 max7 {0,1,2,3,4,5,6}:1
7 20 1g.10gb+me m1 c1 9984MiB 16SM ce1 dec1 enc0 jpeg1 ofa1 max1 {0,1,2,3,4,5,6}:1
9 15 1g.20gb m2 c1 20096MiB 26SM ce1 dec1 enc0 jpeg1 ofa0 max4 {0,2,4,6}:2
1 14 2g.20gb m2 c2 20096MiB 32SM ce2 dec2 enc0 jpeg2 ofa0 max3 {0,2,4}:2
2 9 3g.40gb m4 c3 40448MiB 60SM ce3 dec3 enc0 jpeg3 ofa0 max2 {0,4}:4
3 5 4g.40gb m4 c4 40448MiB 64SM ce4 dec4 enc0 jpeg4 ofa0 max1 {0}:4
4 0 7g.80gb m8 c7 81152MiB 132SM ce8 dec7 enc0 jpeg7 ofa1 max1 {0}:8`},
		{"dgx-h200", "H200", ""},
	} {
		t.Run(tc.model, func(t *testing.T) {
			n, _, got := gpu0(t, tc.preset)
			table, ok := tableForProduct(n.Topology().GPUs[0].ProductName)
			if !ok || table.model != tc.model {
				t.Fatalf("%s: table %q, want %s", tc.preset, table.model, tc.model)
			}
			tm := geometry(got.Name, uint64(n.Topology().GPUs[0].MemoryMiB)<<20, table.mig)
			if rows(got) != rows(*tm) || got.MemorySlices != tm.MemorySlices || got.ComputeSlices != tm.ComputeSlices {
				t.Errorf("read through NVML:\n%s\nthe table:\n%s", rows(got), rows(*tm))
			}
			if tc.want != "" && rows(got) != tc.want {
				t.Errorf("read through NVML:\n%s\nwant:\n%s", rows(got), tc.want)
			}
			if len(got.Instances()) != 25 {
				t.Errorf("%d instances, want the 25 every A100, H100 and H200 offers", len(got.Instances()))
			}
		})
	}
}

// GetGpuInstancePossiblePlacements finds its profile by the info's Id, as
// real NVML does, not by the index the info was asked with.
func TestPossiblePlacementsFindTheProfileByID(t *testing.T) {
	_, d, _ := gpu0(t, "dgx-h100")
	info, ret := d.GetGpuInstanceProfileInfo(index3Slice)
	if ret != nvml.SUCCESS || info.Id != 9 {
		t.Fatalf("GetGpuInstanceProfileInfo(3 slices) = ID %d, %v", info.Id, ret)
	}
	info.Id = 15
	pls, ret := d.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS || len(pls) != 4 || pls[3].Start != 6 || pls[3].Size != 2 {
		t.Errorf("placements of profile ID 15 asked with 3g's info: %v, %v; want {0,2,4,6}:2", pls, ret)
	}
	info.Id = 77
	if _, ret := d.GetGpuInstancePossiblePlacements(&info); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("placements of profile ID 77: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
}

// rtxPro6000 is a made-up MIG GPU that no table knows: four memory
// slices, four compute slices, one profile without a name (the simulated
// node makes it as nvidia-smi would).
const rtxPro6000 = `apiVersion: kyb.ai/v1alpha1
kind: NodeTopology
defaults:
  productName: NVIDIA RTX PRO 6000 Blackwell Server Edition
  architecture: blackwell
  cudaComputeCapability: "12.0"
  memoryMiB: 97887
  mig:
    profiles:
    - {index: 0, id: 14, name: 1g.24gb, sliceCount: 1, instanceCount: 4, multiprocessorCount: 46, memorySizeMB: 24064, copyEngineCount: 1, placements: {starts: [0, 1, 2, 3], size: 1}}
    - {index: 1, id: 5, name: 2g.48gb, sliceCount: 2, instanceCount: 2, multiprocessorCount: 94, memorySizeMB: 48128, copyEngineCount: 2, placements: {starts: [0, 2], size: 2}}
    - {index: 3, id: 0, sliceCount: 4, instanceCount: 1, multiprocessorCount: 188, memorySizeMB: 96256, copyEngineCount: 4, decoderCount: 4, encoderCount: 4, jpegCount: 4, ofaCount: 1, placements: {starts: [0], size: 4}}
gpus:
- {index: 0}
- {index: 1}
`

// writeTopology writes a NodeTopology file for a test.
func writeTopology(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A NodeTopology file gives a GPU no table knows its MIG geometry, which
// the GPU answers through NVML and partitions itself by.
func TestNodeTopologyGivesAGPUItsMIGGeometry(t *testing.T) {
	_, d, m := gpu0(t, writeTopology(t, rtxPro6000))
	want := strings.Join([]string{
		"0 14 1g.24gb m1 c1 24064MiB 46SM ce1 dec0 enc0 jpeg0 ofa0 max4 {0,1,2,3}:1",
		"1 5 2g.48gb m2 c2 48128MiB 94SM ce2 dec0 enc0 jpeg0 ofa0 max2 {0,2}:2",
		"3 0 4g.96gb m4 c4 96256MiB 188SM ce4 dec4 enc4 jpeg4 ofa1 max1 {0}:4",
	}, "\n")
	if got := rows(m); got != want || m.MemorySlices != 4 || m.ComputeSlices != 4 {
		t.Fatalf("geometry (%d memory, %d compute slices):\n%s\nwant 4, 4:\n%s", m.MemorySlices, m.ComputeSlices, got, want)
	}
	enableMIG(t, d)
	// GPU instance IDs follow the memory range on four slices: the whole
	// is 0, the halves 1-2, the single slices 3-6.
	for _, c := range []struct {
		profile string
		start   int
		wantGI  uint32
	}{{"2g.48gb", 2, 2}, {"1g.24gb", 1, 4}, {"1g.24gb", 0, 3}} {
		gi, ret := createGI(t, d, m, c.profile, c.start)
		if ret != nvml.SUCCESS {
			t.Fatalf("%s at %d: %v", c.profile, c.start, ret)
		}
		if info, _ := gi.GetInfo(); info.Id != c.wantGI {
			t.Errorf("%s at %d is GPU instance %d, want %d", c.profile, c.start, info.Id, c.wantGI)
		}
	}
	if _, ret := createGI(t, d, m, "4g.96gb", 0); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("4g.96gb over the three: %v, want ERROR_INSUFFICIENT_RESOURCES", ret)
	}
}
