package simnode

import (
	"strings"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// The simulated node's MIG tables: what NVML answers for the GPU-instance
// profiles of the products it knows, so that a simulated GPU of them
// partitions itself as the real one does. Nothing outside the simulated
// node reads them: the plugin reads every GPU's geometry through NVML.
//
// The profile IDs, indices, slice counts, instance maxima, placements
// and engine counts are what `nvidia-smi mig -lgip` and `-lgipp` print and
// nvmlDeviceGetGpuInstanceProfileInfo answers; memory is NVML's MiB
// (nvidia-smi prints GiB to two decimals). The H200's are those read from
// a real H200 (driver 580.159.04) with MIG mode off. A100, H100 and H200
// share one shape (eight memory slices, seven compute slices); only
// memory, SMs and, between Ampere and Hopper, engines differ. H100 PCIe
// and NVL boards have 114 SMs, not 132, and no table here. A GPU of a
// product without a table, or with one of its own, takes the geometry of
// its NodeTopology entry (v1alpha1.SimulatedMIG).

// The NVML_GPU_INSTANCE_PROFILE_* indices of the tables' profiles.
const (
	index1Slice     = 0x0 // NVML_GPU_INSTANCE_PROFILE_1_SLICE
	index2Slice     = 0x1 // NVML_GPU_INSTANCE_PROFILE_2_SLICE
	index3Slice     = 0x2 // NVML_GPU_INSTANCE_PROFILE_3_SLICE
	index4Slice     = 0x3 // NVML_GPU_INSTANCE_PROFILE_4_SLICE
	index7Slice     = 0x4 // NVML_GPU_INSTANCE_PROFILE_7_SLICE
	index1SliceRev1 = 0x7 // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: with media engines
	index1SliceRev2 = 0x9 // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: twice the memory
)

// engines are a profile's copy engines, decoders, JPEG decoders and OFAs
// (no A100 or Hopper GPU has encoders).
type engines struct{ ce, dec, jpeg, ofa int }

// ampereEngines and hopperEngines are the engines of the seven profiles
// in gen8x7's order.
var (
	ampereEngines = [7]engines{{1, 0, 0, 0}, {1, 1, 1, 1}, {1, 1, 0, 0}, {2, 1, 0, 0}, {3, 2, 0, 0}, {4, 2, 0, 0}, {7, 5, 1, 1}}
	hopperEngines = [7]engines{{1, 1, 1, 0}, {1, 1, 1, 1}, {1, 1, 1, 0}, {2, 2, 2, 0}, {3, 3, 3, 0}, {4, 4, 4, 0}, {8, 7, 7, 1}}
)

// migTable is a model's table.
type migTable struct {
	model string
	mig   v1alpha1.SimulatedMIG
}

// migTables returns the tables, built afresh on every call so that no
// GPU changes another's.
func migTables() []migTable {
	return []migTable{
		gen8x7("A100-40GB", [7]string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
			[7]int64{4864, 4864, 9856, 9856, 19968, 19968, 40192}, [7]int{14, 14, 14, 28, 42, 56, 98}, ampereEngines),
		gen8x7("A100-80GB", [7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
			[7]int64{9728, 9728, 19968, 19968, 40192, 40192, 80896}, [7]int{14, 14, 14, 28, 42, 56, 98}, ampereEngines),
		gen8x7("H100-80GB", [7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
			[7]int64{9984, 9984, 20096, 20096, 40448, 40448, 81152}, [7]int{16, 16, 26, 32, 60, 64, 132}, hopperEngines),
		gen8x7("H200", [7]string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
			[7]int64{16384, 16384, 33280, 33280, 71424, 71424, 143360}, [7]int{16, 16, 26, 32, 60, 64, 132}, hopperEngines),
	}
}

// gen8x7 is the shape A100, H100 and H200 share: eight memory slices,
// seven compute slices, seven profiles in nvidia-smi's order (1g, 1g+me,
// 1g with two memory slices, 2g, 3g, 4g, 7g).
func gen8x7(model string, names [7]string, memMiB [7]int64, sms [7]int, eng [7]engines) migTable {
	shape := [7]struct {
		id, index, mem, compute, max int
		starts                       []int
	}{
		{19, index1Slice, 1, 1, 7, []int{0, 1, 2, 3, 4, 5, 6}},
		{20, index1SliceRev1, 1, 1, 1, []int{0, 1, 2, 3, 4, 5, 6}},
		{15, index1SliceRev2, 2, 1, 4, []int{0, 2, 4, 6}},
		{14, index2Slice, 2, 2, 3, []int{0, 2, 4}},
		{9, index3Slice, 4, 3, 2, []int{0, 4}},
		{5, index4Slice, 4, 4, 1, []int{0}},
		{0, index7Slice, 8, 7, 1, []int{0}},
	}
	t := migTable{model: model}
	for i, s := range shape {
		t.mig.Profiles = append(t.mig.Profiles, v1alpha1.SimulatedMIGProfile{
			Index: s.index, ID: s.id, Name: names[i], SliceCount: s.compute, InstanceCount: s.max,
			MultiprocessorCount: sms[i], MemorySizeMB: memMiB[i],
			CopyEngineCount: eng[i].ce, DecoderCount: eng[i].dec, JpegCount: eng[i].jpeg, OfaCount: eng[i].ofa,
			Placements: v1alpha1.SimulatedPlacements{Starts: s.starts, Size: s.mem},
		})
	}
	return t
}

// tableForProduct is the table of a GPU by the product name NVML reports
// ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB
// HBM3", "NVIDIA H200"); false for a product without one.
func tableForProduct(product string) (migTable, bool) {
	var model string
	switch {
	case strings.Contains(product, "A100") && strings.Contains(product, "40GB"):
		model = "A100-40GB"
	case strings.Contains(product, "A100") && strings.Contains(product, "80GB"):
		model = "A100-80GB"
	// The SXM H100 only: PCIe and NVL H100s have other SM counts.
	case strings.Contains(product, "H100 80GB HBM3"):
		model = "H100-80GB"
	case strings.Contains(product, "H200") && !strings.Contains(product, "NVL"):
		model = "H200"
	default:
		return migTable{}, false
	}
	for _, t := range migTables() {
		if t.model == model {
			return t, true
		}
	}
	return migTable{}, false
}

// geometry is a simulated GPU's MIG geometry as a mig.Model, which the
// simulated node keeps its instances by: the profiles by ID with their
// indices, slices, maxima and placements, as NVML answers for them, and
// the names its MIG devices carry. memoryBytes is the GPU's memory, which
// a name left out is made from.
func geometry(product string, memoryBytes uint64, spec v1alpha1.SimulatedMIG) *mig.Model {
	m := &mig.Model{Name: product}
	for _, p := range spec.Profiles {
		mp := mig.Profile{
			ID: p.ID, Index: p.Index, Name: p.Name, MemorySlices: p.Placements.Size, ComputeSlices: p.SliceCount,
			MemoryMiB: uint64(p.MemorySizeMB), SMs: p.MultiprocessorCount, MaxInstances: p.InstanceCount,
			CopyEngines: p.CopyEngineCount, Decoders: p.DecoderCount, Encoders: p.EncoderCount, JPEGs: p.JpegCount, OFAs: p.OfaCount,
		}
		if mp.Name == "" {
			mp.Name = mig.ProfileName(mp.Index, mp.ComputeSlices, mp.MemoryMiB, memoryBytes)
		}
		for _, s := range p.Placements.Starts {
			mp.Placements = append(mp.Placements, mig.Placement{Start: s, Size: p.Placements.Size})
			m.MemorySlices = max(m.MemorySlices, s+p.Placements.Size)
		}
		m.ComputeSlices = max(m.ComputeSlices, p.SliceCount)
		m.Profiles = append(m.Profiles, mp)
	}
	return m
}
