package v1alpha1

import (
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// SimulatedMIG is the MIG geometry of a simulated GPU: what NVML answers
// for its GPU-instance profiles. A GPU with it is MIG-capable; one
// without it takes the simulated node's table of its product, where
// there is one (A100 40GB and 80GB, H100 80GB HBM3, H200).
//
//	mig:
//	  profiles:
//	  - {index: 0, id: 14, sliceCount: 1, instanceCount: 4, multiprocessorCount: 46, memorySizeMB: 24064, placements: {starts: [0, 1, 2, 3], size: 1}}
//	  - {index: 1, id: 5, sliceCount: 2, instanceCount: 2, multiprocessorCount: 94, memorySizeMB: 48128, placements: {starts: [0, 2], size: 2}}
//	  - {index: 3, id: 0, sliceCount: 4, instanceCount: 1, multiprocessorCount: 188, memorySizeMB: 96256, placements: {starts: [0], size: 4}}
type SimulatedMIG struct {
	// Profiles are the GPU-instance profiles the GPU has; NVML answers
	// ERROR_NOT_SUPPORTED for the other indices.
	Profiles []SimulatedMIGProfile `json:"profiles"`
}

// SimulatedMIGProfile is one GPU-instance profile, as
// nvmlDeviceGetGpuInstanceProfileInfo (its fields named as
// nvmlGpuInstanceProfileInfo_t names them) and
// nvmlDeviceGetGpuInstancePossiblePlacements answer for it.
type SimulatedMIGProfile struct {
	// Index is the NVML_GPU_INSTANCE_PROFILE_* value the profile is asked
	// for by: 0 to 16 (0 1_SLICE, 1 2_SLICE, 2 3_SLICE, 3 4_SLICE,
	// 4 7_SLICE, 5 8_SLICE, 6 6_SLICE, 7 1_SLICE_REV1 (+me), 8
	// 2_SLICE_REV1, 9 1_SLICE_REV2 (twice the memory), 10-12 *_GFX,
	// 13-14 *_NO_ME, 15-16 *_ALL_ME).
	Index int `json:"index"`
	// ID is the profile ID (19 for 1g.10gb on an H100).
	ID int `json:"id"`
	// Name is the profile as nvidia-smi mig -lgip prints it, less its
	// "MIG " prefix, such as 1g.24gb; the names of the GPU's MIG devices
	// end with it. Default: made from the other fields as NVIDIA's tools
	// make it (pkg/mig).
	Name string `json:"name,omitempty"`
	// SliceCount is the compute slices an instance takes.
	SliceCount int `json:"sliceCount"`
	// InstanceCount is how many instances of the profile a GPU holds.
	InstanceCount       int   `json:"instanceCount"`
	MultiprocessorCount int   `json:"multiprocessorCount"`
	MemorySizeMB        int64 `json:"memorySizeMB"`
	CopyEngineCount     int   `json:"copyEngineCount,omitempty"`
	DecoderCount        int   `json:"decoderCount,omitempty"`
	EncoderCount        int   `json:"encoderCount,omitempty"`
	JpegCount           int   `json:"jpegCount,omitempty"`
	OfaCount            int   `json:"ofaCount,omitempty"`
	// Placements are where an instance may sit on the memory slices.
	Placements SimulatedPlacements `json:"placements"`
}

// SimulatedPlacements are a profile's placements, {starts}:size as
// `nvidia-smi mig -lgipp` prints them.
type SimulatedPlacements struct {
	// Starts are the first memory slices, in NVML's order.
	Starts []int `json:"starts"`
	// Size is the memory slices each placement covers.
	Size int `json:"size"`
}

// The bounds of a simulated MIG geometry.
const (
	// MaxMIGProfileIndex is the last NVML_GPU_INSTANCE_PROFILE_* index
	// (NVML_GPU_INSTANCE_PROFILE_COUNT is 17).
	MaxMIGProfileIndex = 16
	// MaxSimulatedMemorySlices is the most memory slices a simulated GPU
	// has, as every MIG GPU so far: the simulated kernel lists the
	// capability minors of 15 GPU instances per GPU, all that eight
	// slices allow.
	MaxSimulatedMemorySlices = 8
)

// validateMIGGeometry checks a simulated GPU's MIG geometry: each
// profile's index and ID unique, its counts positive, its placements on
// the GPU's memory slices.
func validateMIGGeometry(m *SimulatedMIG, path *field.Path, errs *FieldErrors) {
	if len(m.Profiles) == 0 {
		errs.Add(path.Child("profiles"), "required: a MIG GPU has at least one GPU-instance profile")
	}
	indices, ids := seen[int]{}, seen[int]{}
	for i, p := range m.Profiles {
		pp := path.Child("profiles").Index(i)
		if p.Index < 0 || p.Index > MaxMIGProfileIndex {
			errs.Add(pp.Child("index"), "must be an NVML_GPU_INSTANCE_PROFILE_* value between 0 and %d, not %d", MaxMIGProfileIndex, p.Index)
		} else {
			indices.claimIn(p.Index, "index", i, pp.Child("index"), errs)
		}
		if p.ID < 0 {
			errs.Add(pp.Child("id"), "must not be negative, not %d", p.ID)
		} else {
			ids.claimIn(p.ID, "ID", i, pp.Child("id"), errs)
		}
		for _, c := range []struct {
			name string
			v    int64
		}{
			{"sliceCount", int64(p.SliceCount)}, {"instanceCount", int64(p.InstanceCount)},
			{"multiprocessorCount", int64(p.MultiprocessorCount)}, {"memorySizeMB", p.MemorySizeMB},
		} {
			if c.v < 1 {
				errs.Add(pp.Child(c.name), "must be at least 1, not %d", c.v)
			}
		}
		for _, c := range []struct {
			name string
			v    int
		}{
			{"copyEngineCount", p.CopyEngineCount}, {"decoderCount", p.DecoderCount}, {"encoderCount", p.EncoderCount},
			{"jpegCount", p.JpegCount}, {"ofaCount", p.OfaCount},
		} {
			if c.v < 0 {
				errs.Add(pp.Child(c.name), "must not be negative, not %d", c.v)
			}
		}
		validatePlacements(p.Placements, pp.Child("placements"), errs)
	}
}

// claimIn is claim for a value unique among a GPU's MIG profiles.
func (s seen[K]) claimIn(key K, what string, i int, path *field.Path, errs *FieldErrors) {
	if j, dup := s[key]; dup {
		errs.Add(path, "%s %v is already that of profiles[%d]", what, key, j)
		return
	}
	s[key] = i
}

// validatePlacements keeps placements on the grid every MIG GPU has
// them on: 1, 2, 4 or 8 memory slices from a multiple of that size.
func validatePlacements(p SimulatedPlacements, path *field.Path, errs *FieldErrors) {
	if !slices.Contains([]int{1, 2, 4, 8}, p.Size) {
		errs.Add(path.Child("size"), "must be 1, 2, 4 or 8 memory slices, not %d", p.Size)
	}
	if len(p.Starts) == 0 {
		errs.Add(path.Child("starts"), "required: a profile has at least one placement")
	}
	for j, s := range p.Starts {
		switch {
		case s < 0 || s+max(p.Size, 1) > MaxSimulatedMemorySlices:
			errs.Add(path.Child("starts").Index(j), "a placement of %d slices at %d does not lie on the %d memory slices a simulated GPU has at most", p.Size, s, MaxSimulatedMemorySlices)
		case p.Size > 0 && s%p.Size != 0:
			errs.Add(path.Child("starts").Index(j), "a placement of %d slices starts at a multiple of %d, not at %d", p.Size, p.Size, s)
		case slices.Contains(p.Starts[:j], s):
			errs.Add(path.Child("starts").Index(j), "start %d is listed twice", s)
		}
	}
}
