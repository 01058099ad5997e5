package mig

import (
	"fmt"
	"strings"
)

// The NVML_GPU_INSTANCE_PROFILE_* constants of nvml.h that name the
// profiles of the models here; Profile.Index holds one of them.
const (
	profile1Slice     = 0x0 // NVML_GPU_INSTANCE_PROFILE_1_SLICE
	profile2Slice     = 0x1 // NVML_GPU_INSTANCE_PROFILE_2_SLICE
	profile3Slice     = 0x2 // NVML_GPU_INSTANCE_PROFILE_3_SLICE
	profile4Slice     = 0x3 // NVML_GPU_INSTANCE_PROFILE_4_SLICE
	profile7Slice     = 0x4 // NVML_GPU_INSTANCE_PROFILE_7_SLICE
	profile1SliceRev1 = 0x7 // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: with media engines
	profile1SliceRev2 = 0x9 // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: twice the memory
)

// Models returns the GPU models whose MIG geometry this package knows,
// A100-40GB, A100-80GB and H100-80GB (SXM), built afresh on every call so
// that no caller can change another's tables.
func Models() []Model {
	return []Model{
		gen8x7("A100-40GB", [7]string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
			[7]uint64{4864, 4864, 9856, 9856, 19968, 19968, 40192}, [7]int{14, 14, 14, 28, 42, 56, 98}),
		gen8x7("A100-80GB", [7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
			[7]uint64{9728, 9728, 19968, 19968, 40192, 40192, 80896}, [7]int{14, 14, 14, 28, 42, 56, 98}),
		gen8x7("H100-80GB", [7]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
			[7]uint64{9984, 9984, 20096, 20096, 40448, 40448, 81152}, [7]int{16, 16, 26, 32, 60, 64, 132}),
	}
}

// gen8x7 is the geometry A100 and H100 share: eight memory slices, seven
// compute slices, seven profiles in nvidia-smi's order (1g, 1g+me, 1g with
// two memory slices, 2g, 3g, 4g, 7g); only names, memory and SMs differ.
func gen8x7(name string, names [7]string, memMiB [7]uint64, sms [7]int) Model {
	shape := [7]struct {
		id, index, mem, compute, max int
		me                           bool
		starts                       []int
	}{
		{19, profile1Slice, 1, 1, 7, false, []int{0, 1, 2, 3, 4, 5, 6}},
		{20, profile1SliceRev1, 1, 1, 1, true, []int{0, 1, 2, 3, 4, 5, 6}},
		{15, profile1SliceRev2, 2, 1, 4, false, []int{0, 2, 4, 6}},
		{14, profile2Slice, 2, 2, 3, false, []int{0, 2, 4}},
		{9, profile3Slice, 4, 3, 2, false, []int{0, 4}},
		{5, profile4Slice, 4, 4, 1, false, []int{0}},
		{0, profile7Slice, 8, 7, 1, false, []int{0}},
	}
	m := Model{Name: name, MemorySlices: 8, ComputeSlices: 7}
	for i, s := range shape {
		p := Profile{
			ID: s.id, Index: s.index, Name: names[i],
			MemorySlices: s.mem, ComputeSlices: s.compute,
			MemoryMiB: memMiB[i], SMs: sms[i], MaxInstances: s.max, MediaExtensions: s.me,
		}
		for _, start := range s.starts {
			p.Placements = append(p.Placements, Placement{Start: start, Size: s.mem})
		}
		m.Profiles = append(m.Profiles, p)
	}
	return m
}

// ModelByName returns a model by this package's name for it (H100-80GB).
func ModelByName(name string) (Model, error) {
	var names []string
	for _, m := range Models() {
		if m.Name == name {
			return m, nil
		}
		names = append(names, m.Name)
	}
	return Model{}, fmt.Errorf("no MIG geometry for GPU model %q; known models are %s", name, strings.Join(names, ", "))
}

// ModelForProduct returns the model of a GPU by the product name NVML
// reports (nvmlDeviceGetName): "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB
// PCIe", "NVIDIA H100 80GB HBM3". A product with MIG whose geometry this
// package does not know (A30, H100 PCIe, H200, B200) is an error naming
// it, as is one without MIG.
func ModelForProduct(product string) (Model, error) {
	var name string
	switch {
	case strings.Contains(product, "A100") && strings.Contains(product, "40GB"):
		name = "A100-40GB"
	case strings.Contains(product, "A100") && strings.Contains(product, "80GB"):
		name = "A100-80GB"
	// The SXM H100 only: PCIe and NVL H100s have 114 SMs, not 132, and
	// their profiles other SM counts.
	case strings.Contains(product, "H100 80GB HBM3"):
		name = "H100-80GB"
	default:
		return Model{}, fmt.Errorf("no MIG geometry for GPU %q; known models are A100-40GB, A100-80GB and H100-80GB (SXM)", product)
	}
	return ModelByName(name)
}
