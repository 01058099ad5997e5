package simnode

import (
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// simGI is a GPU instance on a simulated GPU.
type simGI struct {
	gpu       *migGPU
	id        int
	profile   mig.Profile
	placement mig.Placement
	handle    *mock.GpuInstance
	cis       map[int]*simCI
	gone      bool
}

// simCI is a compute instance and its MIG device.
type simCI struct {
	gi      *simGI
	id      int
	profile ciProfile
	start   int
	handle  *mock.ComputeInstance
	device  *mock.Device
	uuid    string
	gone    bool
}

// ciProfile is a compute-instance profile a GPU instance offers.
type ciProfile struct {
	// index is the NVML_COMPUTE_INSTANCE_PROFILE_* constant, which is also
	// the profile's ID.
	index, slices, sms, count int
}

// ciIndex maps compute slices to NVML_COMPUTE_INSTANCE_PROFILE_*.
var ciIndex = map[int]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, 8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE}

// ciProfiles are the compute-instance profiles of a GPU instance: a 4g
// splits into 1, 2 or 4 slices, not 3, as nvidia-smi mig -lcip shows; a
// GPU instance of a size the tables do not have splits into single
// slices or not at all.
func ciProfiles(m mig.Model, gi mig.Profile) []ciProfile {
	sizes, ok := map[int][]int{1: {1}, 2: {1, 2}, 3: {1, 2, 3}, 4: {1, 2, 4}, 7: {1, 2, 3, 4, 7}}[gi.ComputeSlices]
	if !ok {
		sizes = []int{1, gi.ComputeSlices}
	}
	var out []ciProfile
	for _, s := range sizes {
		sms := gi.SMs
		if s != gi.ComputeSlices {
			// A part of a GPU instance has the SMs of the smallest GPU
			// instance of that many compute slices.
			sms = 0
			for _, p := range m.Profiles {
				if p.ComputeSlices == s && (sms == 0 || p.SMs < sms) {
					sms = p.SMs
				}
			}
			if sms == 0 {
				sms = gi.SMs * s / gi.ComputeSlices
			}
		}
		if _, ok := ciIndex[s]; ok {
			out = append(out, ciProfile{index: ciIndex[s], slices: s, sms: sms, count: gi.ComputeSlices / s})
		}
	}
	return out
}

// giID is a GPU instance's ID, which follows its memory range on a GPU
// of memSlices slices (rounded up to a power of two): the whole first,
// then the halves, the quarters, down to single slices. NodeTopology
// keeps placements on that grid (a size of 1, 2, 4 or 8 slices, a start
// that is a multiple of it), as every MIG GPU has them, so IDs are unique
// and below the 15 the capability minors are listed for.
func giID(memSlices int, p mig.Placement) int {
	whole := 1
	for whole < memSlices {
		whole *= 2
	}
	return whole/p.Size - 1 + p.Start/p.Size
}

func (g *migGPU) profileInfo(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	return answer(g, CallGetGpuInstanceProfileInfo, nil, func() (nvml.GpuInstanceProfileInfo, nvml.Return) {
		// Past the last index NVML says ERROR_INVALID_ARGUMENT, which ends
		// a caller's walk over the indices, on any GPU.
		if index < 0 || index >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		if !g.capable || g.model == nil {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		for _, p := range g.model.Profiles {
			if p.Index == index {
				return nvml.GpuInstanceProfileInfo{
					Id: uint32(p.ID), SliceCount: uint32(p.ComputeSlices), InstanceCount: uint32(p.MaxInstances),
					MultiprocessorCount: uint32(p.SMs), MemorySizeMB: p.MemoryMiB,
					CopyEngineCount: uint32(p.CopyEngines), DecoderCount: uint32(p.Decoders), EncoderCount: uint32(p.Encoders),
					JpegCount: uint32(p.JPEGs), OfaCount: uint32(p.OFAs),
				}, nvml.SUCCESS
			}
		}
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	})
}

// profileByInfo is the profile an info names, or the answer to give.
func (g *migGPU) profileByInfo(info *nvml.GpuInstanceProfileInfo) (mig.Profile, nvml.Return) {
	if info == nil {
		return mig.Profile{}, nvml.ERROR_INVALID_ARGUMENT
	}
	p, err := g.model.ProfileByID(int(info.Id))
	if err != nil {
		return mig.Profile{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return p, nvml.SUCCESS
}

// possiblePlacements answers whatever the MIG mode, as nvml.h says.
func (g *migGPU) possiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	return answer(g, CallGetGpuInstancePossiblePlacements, nil, func() ([]nvml.GpuInstancePlacement, nvml.Return) {
		if !g.capable || g.model == nil {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		p, ret := g.profileByInfo(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		var out []nvml.GpuInstancePlacement
		for _, pl := range p.Placements {
			out = append(out, nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		}
		return out, nvml.SUCCESS
	})
}

func (g *migGPU) createGPUInstance(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
	return answer(g, CallCreateGpuInstance, nil, func() (nvml.GpuInstance, nvml.Return) {
		if ret := g.enabledLocked(); ret != nvml.SUCCESS {
			return nil, ret
		}
		p, ret := g.profileByInfo(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		for _, pl := range p.Placements {
			if gi, ret := g.createLocked(p, pl); ret == nvml.SUCCESS {
				return gi, ret
			}
		}
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	})
}

func (g *migGPU) createGPUInstanceAt(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	return answer(g, CallCreateGpuInstanceWithPlacement, nil, func() (nvml.GpuInstance, nvml.Return) {
		if ret := g.enabledLocked(); ret != nvml.SUCCESS {
			return nil, ret
		}
		p, ret := g.profileByInfo(info)
		if ret != nvml.SUCCESS || at == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		pl := mig.Placement{Start: int(at.Start), Size: int(at.Size)}
		if !slices.Contains(p.Placements, pl) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return g.createLocked(p, pl)
	})
}

// createLocked makes a GPU instance if it fits beside the others.
func (g *migGPU) createLocked(p mig.Profile, pl mig.Placement) (nvml.GpuInstance, nvml.Return) {
	instances := []mig.Instance{{Profile: p, Placement: pl}}
	for _, gi := range g.gis {
		instances = append(instances, mig.Instance{Profile: gi.profile, Placement: gi.placement})
	}
	if err := g.model.Coexist(instances); err != nil {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	gi := &simGI{gpu: g, id: giID(g.model.MemorySlices, pl), profile: p, placement: pl, cis: map[int]*simCI{}}
	gi.handle = gi.newHandle()
	g.gis[gi.id] = gi
	return gi.handle, nvml.SUCCESS
}

func (g *migGPU) gpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	return answer(g, CallGetGpuInstances, nil, func() ([]nvml.GpuInstance, nvml.Return) {
		if ret := g.enabledLocked(); ret != nvml.SUCCESS {
			return nil, ret
		}
		p, ret := g.profileByInfo(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		var out []nvml.GpuInstance
		for _, gi := range sortedByID(g.gis) {
			if gi.profile.ID == p.ID {
				out = append(out, gi.handle)
			}
		}
		return out, nvml.SUCCESS
	})
}

func (g *migGPU) gpuInstanceByID(id int) (nvml.GpuInstance, nvml.Return) {
	return answer(g, CallGetGpuInstanceByID, nil, func() (nvml.GpuInstance, nvml.Return) {
		if ret := g.enabledLocked(); ret != nvml.SUCCESS {
			return nil, ret
		}
		gi, ok := g.gis[id]
		if !ok {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return gi.handle, nvml.SUCCESS
	})
}

// sortedByID returns a map's values by key, so that lists do not follow
// map order.
func sortedByID[T any](m map[int]T) []T {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]T, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

// newHandle is the GPU instance's NVML handle.
func (gi *simGI) newHandle() *mock.GpuInstance {
	g, gone := gi.gpu, &gi.gone
	return &mock.GpuInstance{
		GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
			return answer(g, CallGpuInstanceGetInfo, gone, gi.infoLocked)
		},
		GetComputeInstanceProfileInfoFunc: func(profile, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
			return answer(g, CallGetComputeInstanceProfileInfo, gone, func() (nvml.ComputeInstanceProfileInfo, nvml.Return) {
				return gi.ciProfileInfoLocked(profile, engProfile)
			})
		},
		CreateComputeInstanceFunc: func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
			return answer(g, CallCreateComputeInstance, gone, func() (nvml.ComputeInstance, nvml.Return) {
				if info == nil {
					return nil, nvml.ERROR_INVALID_ARGUMENT
				}
				cp, ok := gi.ciProfile(int(info.Id))
				if !ok {
					return nil, nvml.ERROR_NOT_SUPPORTED
				}
				return gi.createLocked(cp)
			})
		},
		GetComputeInstancesFunc: func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
			return answer(g, CallGetComputeInstances, gone, func() ([]nvml.ComputeInstance, nvml.Return) {
				return gi.computeInstancesLocked(info)
			})
		},
		GetComputeInstanceByIdFunc: func(id int) (nvml.ComputeInstance, nvml.Return) {
			return answer(g, CallGetComputeInstanceByID, gone, func() (nvml.ComputeInstance, nvml.Return) {
				ci, ok := gi.cis[id]
				if !ok {
					return nil, nvml.ERROR_NOT_FOUND
				}
				return ci.handle, nvml.SUCCESS
			})
		},
		DestroyFunc: func() nvml.Return { return answerCode(g, CallGpuInstanceDestroy, gone, gi.destroyLocked) },
	}
}

func (gi *simGI) infoLocked() (nvml.GpuInstanceInfo, nvml.Return) {
	return nvml.GpuInstanceInfo{
		Device: gi.gpu.parent, Id: uint32(gi.id), ProfileId: uint32(gi.profile.ID),
		Placement: nvml.GpuInstancePlacement{Start: uint32(gi.placement.Start), Size: uint32(gi.placement.Size)},
	}, nvml.SUCCESS
}

func (gi *simGI) ciProfileInfoLocked(profile, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	if profile < 0 || profile >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT || engProfile != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	cp, ok := gi.ciProfile(profile)
	if !ok {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.ComputeInstanceProfileInfo{
		Id: uint32(cp.index), SliceCount: uint32(cp.slices), InstanceCount: uint32(cp.count), MultiprocessorCount: uint32(cp.sms),
	}, nvml.SUCCESS
}

func (gi *simGI) computeInstancesLocked(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if _, ok := gi.ciProfile(int(info.Id)); !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	var out []nvml.ComputeInstance
	for _, ci := range sortedByID(gi.cis) {
		if ci.profile.index == int(info.Id) {
			out = append(out, ci.handle)
		}
	}
	return out, nvml.SUCCESS
}

// destroyLocked destroys the GPU instance, which NVML refuses while it
// has compute instances.
func (gi *simGI) destroyLocked() nvml.Return {
	if len(gi.cis) > 0 {
		return nvml.ERROR_IN_USE
	}
	gi.dropLocked()
	delete(gi.gpu.gis, gi.id)
	return nvml.SUCCESS
}

func (gi *simGI) ciProfile(index int) (ciProfile, bool) {
	for _, cp := range ciProfiles(*gi.gpu.model, gi.profile) {
		if cp.index == index {
			return cp, true
		}
	}
	return ciProfile{}, false
}

// createLocked makes a compute instance at the lowest free start aligned
// to its size, with the lowest free ID.
func (gi *simGI) createLocked(cp ciProfile) (nvml.ComputeInstance, nvml.Return) {
	same := 0
	used := make([]bool, gi.profile.ComputeSlices)
	for _, ci := range gi.cis {
		if ci.profile.index == cp.index {
			same++
		}
		for s := ci.start; s < ci.start+ci.profile.slices; s++ {
			used[s] = true
		}
	}
	if same >= cp.count {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	start := -1
	for s := 0; s+cp.slices <= len(used) && start < 0; s += cp.slices {
		if !slices.Contains(used[s:s+cp.slices], true) {
			start = s
		}
	}
	if start < 0 {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	id := 0
	for gi.cis[id] != nil {
		id++
	}
	ci := &simCI{gi: gi, id: id, profile: cp, start: start}
	ci.uuid = gi.gpu.m.nextUUID(gi.gpu.index, gi.id, id)
	ci.handle = ci.newHandle()
	ci.device = ci.newDevice()
	gi.cis[id] = ci
	return ci.handle, nvml.SUCCESS
}

// dropLocked invalidates the instance's handles and its compute
// instances'.
func (gi *simGI) dropLocked() {
	gi.gone = true
	for id, ci := range gi.cis {
		ci.gone = true
		delete(gi.cis, id)
	}
}

// newHandle is the compute instance's NVML handle.
func (ci *simCI) newHandle() *mock.ComputeInstance {
	gi := ci.gi
	g, gone := gi.gpu, &ci.gone
	return &mock.ComputeInstance{
		GetInfoFunc: func() (nvml.ComputeInstanceInfo, nvml.Return) {
			return answer(g, CallComputeInstanceGetInfo, gone, func() (nvml.ComputeInstanceInfo, nvml.Return) {
				return nvml.ComputeInstanceInfo{
					Device: g.parent, GpuInstance: gi.handle, Id: uint32(ci.id), ProfileId: uint32(ci.profile.index),
					Placement: nvml.ComputeInstancePlacement{Start: uint32(ci.start), Size: uint32(ci.profile.slices)},
				}, nvml.SUCCESS
			})
		},
		DestroyFunc: func() nvml.Return {
			return answerCode(g, CallComputeInstanceDestroy, gone, func() nvml.Return {
				ci.gone = true
				delete(gi.cis, ci.id)
				return nvml.SUCCESS
			})
		},
	}
}

// liveCIsLocked are the GPU's compute instances in GPU-instance then
// compute-instance ID order, the order of its MIG device indexes.
func (g *migGPU) liveCIsLocked() []*simCI {
	var out []*simCI
	for _, gi := range sortedByID(g.gis) {
		out = append(out, sortedByID(gi.cis)...)
	}
	return out
}
