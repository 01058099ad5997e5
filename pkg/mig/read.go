package mig

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The geometry of a GPU is read from NVML once, where the GPUs are
// discovered, never looked up by product name: every MIG GPU (A30, A100,
// H100, H200, B200, GB200, RTX PRO 6000, and those to come) answers
// nvmlDeviceGetGpuInstanceProfileInfo for each profile it has and
// nvmlDeviceGetGpuInstancePossiblePlacements for each such profile, with
// MIG mode on or off. Read takes those calls through Device, the few
// methods of an NVML device handle it needs, so that this package holds
// no handle and a simulated node answers them as a real GPU does.
//
// Profile names. NVML's versioned call (nvmlDeviceGetGpuInstanceProfileInfoV)
// carries a name, but nvml.h documents it as answering NOT_SUPPORTED
// while MIG mode is off, and the plugin needs the geometry before MIG is
// on (a Hopper GPU goes into MIG mode at its first MIG prepare); go-nvml
// also returns its answer through a handler bound to a C handle, which no
// simulated device can give. So the name is made from the unversioned
// answer as NVIDIA's own tools make it (the device plugin's mixed-strategy
// resources, mig-parted, the GPU operator): "<compute slices>g.<GB>gb",
// where GB is the profile's memory rounded up to eighths of the GPU's
// memory, times the GPU's memory in GiB rounded up (1g.18gb on an H200 of
// 143771 MiB, 16384 MiB of which the profile has), and a suffix for the
// profile variants NVML's index names: +me (REV1, media engines), +gfx,
// -me (no media engines), +me.all (all of them). These are the names
// nvidia-smi mig -lgip prints, less their "MIG " prefix.

// Device is the part of an NVML device handle the geometry is read
// through. go-nvml's nvml.Device has it, and so does a simulated node's.
type Device interface {
	GetMigMode() (current, pending int, ret nvml.Return)
	GetGpuInstanceProfileInfo(profile int) (nvml.GpuInstanceProfileInfo, nvml.Return)
	GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return)
}

// ErrNotCapable is Read's error for a GPU without MIG: GetMigMode answers
// ERROR_NOT_SUPPORTED.
var ErrNotCapable = errors.New("not MIG-capable")

// MaxMemorySlices is the most memory slices a geometry may have. The
// publisher keeps a GPU's slice counters and its profiles' seat counters
// in one counter set of at most 32, and every MIG GPU so far has 4 or 8.
const MaxMemorySlices = 8

// maxProfileIndex bounds the walk over profile indices: nvml.h asks
// callers to go on until ERROR_INVALID_ARGUMENT (there are 17 today,
// NVML_GPU_INSTANCE_PROFILE_COUNT), so that later profiles are found by
// this code too; a driver that never says so must not keep it walking.
const maxProfileIndex = 256

// ProfileInfoer is the part of an NVML device handle that describes its
// GPU-instance profiles.
type ProfileInfoer interface {
	GetGpuInstanceProfileInfo(profile int) (nvml.GpuInstanceProfileInfo, nvml.Return)
}

// WalkProfiles calls f with each GPU-instance profile dev has, by NVML
// index, as nvml.h asks the indices to be walked: until
// ERROR_INVALID_ARGUMENT, skipping those the GPU answers
// ERROR_NOT_SUPPORTED for. Whatever reads profiles walks them this way,
// so that a profile Read publishes is one whose instances a listing
// finds; go-nvml's GPU_INSTANCE_PROFILE_COUNT is only the count of the
// release it was generated from. An error of f ends the walk.
func WalkProfiles(dev ProfileInfoer, f func(index int, info nvml.GpuInstanceProfileInfo) error) error {
	for index := 0; ; index++ {
		if index == maxProfileIndex {
			return fmt.Errorf("GetGpuInstanceProfileInfo answered for %d profile indices without ERROR_INVALID_ARGUMENT", maxProfileIndex)
		}
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret == nvml.ERROR_INVALID_ARGUMENT {
			return nil // past the last profile
		}
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue // a profile this GPU does not have
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GetGpuInstanceProfileInfo(%d): %s", index, nvml.ErrorString(ret))
		}
		if err := f(index, info); err != nil {
			return err
		}
	}
}

// Read reads the MIG geometry of a GPU from NVML: product names it
// (nvmlDeviceGetName), memoryBytes is its total memory
// (nvmlDeviceGetMemoryInfo), which the profiles' names are made from.
// The error names the NVML call that failed and its answer, wraps
// ErrNotCapable for a GPU without MIG, or says why the geometry is not
// one the plugin can publish.
func Read(dev Device, product string, memoryBytes uint64) (Model, error) {
	if _, _, ret := dev.GetMigMode(); ret == nvml.ERROR_NOT_SUPPORTED {
		return Model{}, fmt.Errorf("%w: GetMigMode: %s", ErrNotCapable, nvml.ErrorString(ret))
	} else if ret != nvml.SUCCESS {
		return Model{}, fmt.Errorf("GetMigMode: %s", nvml.ErrorString(ret))
	}
	m := Model{Name: product}
	err := WalkProfiles(dev, func(index int, info nvml.GpuInstanceProfileInfo) error {
		// Real NVML finds the profile by info.Id: the info is passed on
		// as NVML gave it.
		pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GetGpuInstancePossiblePlacements(profile ID %d): %s", info.Id, nvml.ErrorString(ret))
		}
		p, err := profile(index, info, pls, memoryBytes)
		if err != nil {
			return err
		}
		m.Profiles = append(m.Profiles, p)
		return nil
	})
	if err != nil {
		return Model{}, err
	}
	if len(m.Profiles) == 0 {
		return Model{}, errors.New("no GPU-instance profile: GetGpuInstanceProfileInfo answered ERROR_NOT_SUPPORTED for every one")
	}
	if err := m.complete(); err != nil {
		return Model{}, fmt.Errorf("the MIG geometry NVML gives cannot be published: %w", err)
	}
	return m, nil
}

// profile is one profile as NVML described it.
func profile(index int, info nvml.GpuInstanceProfileInfo, pls []nvml.GpuInstancePlacement, memoryBytes uint64) (Profile, error) {
	p := Profile{
		ID: int(info.Id), Index: index, ComputeSlices: int(info.SliceCount), MemoryMiB: info.MemorySizeMB,
		SMs: int(info.MultiprocessorCount), MaxInstances: int(info.InstanceCount),
		CopyEngines: int(info.CopyEngineCount), Decoders: int(info.DecoderCount), Encoders: int(info.EncoderCount),
		JPEGs: int(info.JpegCount), OFAs: int(info.OfaCount),
	}
	p.Name = ProfileName(index, p.ComputeSlices, p.MemoryMiB, memoryBytes)
	if len(pls) == 0 {
		return p, fmt.Errorf("GetGpuInstancePossiblePlacements(profile ID %d): no placement", p.ID)
	}
	for _, pl := range pls {
		p.Placements = append(p.Placements, Placement{Start: int(pl.Start), Size: int(pl.Size)})
	}
	p.MemorySlices = p.Placements[0].Size
	for _, pl := range p.Placements {
		if pl.Size != p.MemorySlices || pl.Size < 1 {
			return p, fmt.Errorf("GetGpuInstancePossiblePlacements(profile ID %d): placements of different sizes: %v", p.ID, p.Placements)
		}
	}
	if p.ComputeSlices < 1 || p.MaxInstances < 1 {
		return p, fmt.Errorf("GetGpuInstanceProfileInfo(%d): profile ID %d has %d compute slices and at most %d instances", index, p.ID, p.ComputeSlices, p.MaxInstances)
	}
	return p, nil
}

// The NVML_GPU_INSTANCE_PROFILE_* indices of the profile variants whose
// names carry a suffix.
const (
	index1SliceRev1  = 0x7  // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
	index2SliceRev1  = 0x8  // NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
	index1SliceGfx   = 0x0A // NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
	index2SliceGfx   = 0x0B // NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX
	index4SliceGfx   = 0x0C // NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX
	index1SliceNoME  = 0x0D // NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
	index2SliceNoME  = 0x0E // NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME
	index1SliceAllME = 0x0F // NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
	index2SliceAllME = 0x10 // NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME
)

// ProfileName names a profile as nvidia-smi does (the top of this file):
// index is its NVML_GPU_INSTANCE_PROFILE_* value, memoryMiB its memory,
// memoryBytes the GPU's.
func ProfileName(index, computeSlices int, memoryMiB, memoryBytes uint64) string {
	suffix := ""
	switch index {
	case index1SliceRev1, index2SliceRev1:
		suffix = "+me"
	case index1SliceGfx, index2SliceGfx, index4SliceGfx:
		suffix = "+gfx"
	case index1SliceNoME, index2SliceNoME:
		suffix = "-me"
	case index1SliceAllME, index2SliceAllME:
		suffix = "+me.all"
	}
	return fmt.Sprintf("%dg.%dgb%s", computeSlices, memoryGB(memoryMiB, memoryBytes), suffix)
}

// memoryGB is the "18gb" of 1g.18gb: the profile's share of the GPU's
// memory rounded up to eighths, times the GPU's memory in GiB rounded up,
// rounded to the nearest integer (halves up). Integer arithmetic, so that
// no float rounding decides a name.
func memoryGB(memoryMiB, memoryBytes uint64) uint64 {
	const mib, gib = 1 << 20, 1 << 30
	if memoryBytes == 0 {
		return memoryMiB / 1024
	}
	eighths := (8*memoryMiB*mib + memoryBytes - 1) / memoryBytes
	totalGiB := (memoryBytes + gib - 1) / gib
	return (eighths*totalGiB*2 + 8) / 16
}

// complete derives the GPU's slices from its profiles and checks what the
// plugin relies on: distinct profile IDs, distinct names (a
// configuration reaches a profile by its name, and Profile returns the
// first of a name), placements within MaxMemorySlices, and instances on disjoint memory
// slices never taking more compute slices than the GPU has, the rule
// that lets counters of memory slices alone keep MIG devices apart.
func (m *Model) complete() error {
	slices.SortStableFunc(m.Profiles, func(a, b Profile) int {
		return cmp.Or(cmp.Compare(a.ComputeSlices, b.ComputeSlices), cmp.Compare(a.MemoryMiB, b.MemoryMiB), cmp.Compare(a.Index, b.Index))
	})
	ids, names := map[int]int{}, map[string]int{}
	for _, p := range m.Profiles {
		if other, dup := ids[p.ID]; dup {
			return fmt.Errorf("profile indices %d and %d both have profile ID %d", other, p.Index, p.ID)
		}
		ids[p.ID] = p.Index
		if other, dup := names[p.Name]; dup {
			return fmt.Errorf("profile indices %d and %d are both named %s", other, p.Index, p.Name)
		}
		names[p.Name] = p.Index
		m.ComputeSlices = max(m.ComputeSlices, p.ComputeSlices)
		for _, pl := range p.Placements {
			if pl.Start < 0 {
				return fmt.Errorf("profile ID %d has placement %s", p.ID, pl)
			}
			m.MemorySlices = max(m.MemorySlices, pl.End())
		}
	}
	if m.MemorySlices > MaxMemorySlices {
		return fmt.Errorf("%d memory slices; the plugin publishes at most %d per GPU", m.MemorySlices, MaxMemorySlices)
	}
	if c := m.maxDisjointCompute(); c > m.ComputeSlices {
		return fmt.Errorf("instances on disjoint memory slices can take %d compute slices of the GPU's %d, which memory-slice counters cannot keep apart", c, m.ComputeSlices)
	}
	return nil
}

// maxDisjointCompute is the most compute slices instances on disjoint
// memory slices can take, each profile's maximum count aside: the best
// sum over placements that share no slice, slice by slice.
func (m *Model) maxDisjointCompute() int {
	best := make([]int, m.MemorySlices+1) // best[e]: over slices [0, e)
	for e := 1; e <= m.MemorySlices; e++ {
		best[e] = best[e-1]
		for _, p := range m.Profiles {
			for _, pl := range p.Placements {
				if pl.End() == e {
					best[e] = max(best[e], best[pl.Start]+p.ComputeSlices)
				}
			}
		}
	}
	return best[m.MemorySlices]
}
