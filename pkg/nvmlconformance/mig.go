package nvmlconformance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
)

// maxProfileIndex bounds the walk over profile indices as pkg/mig bounds
// it.
const maxProfileIndex = 256

// geometry is a GPU's MIG geometry as pkg/mig reads it.
type geometry struct {
	model mig.Model
}

// migGeometry walks the GPU's profiles as pkg/mig does, checks every
// answer against what the plugin builds on it, and then that pkg/mig's
// own reading agrees:
//
//   - GetMigMode answers, or ERROR_NOT_SUPPORTED (no MIG);
//   - GetGpuInstanceProfileInfo answers for the profiles the GPU has,
//     ERROR_NOT_SUPPORTED for the indices it lacks and
//     ERROR_INVALID_ARGUMENT past the last;
//   - GetGpuInstancePossiblePlacements, given the profile's info as NVML
//     gave it, answers placements of one size, aligned to it, within the
//     eight memory slices the publisher counts, at least as large as the
//     profile's compute slices;
//   - the profile's memory is its placements' share of the GPU's memory
//     slices (what its name is made from, and how a GPU answering
//     another profile's placements shows);
//   - its instance count fits at once: the planner publishes that many
//     seats, so as many instances must sit on disjoint placements within
//     the GPU's compute slices;
//   - profile IDs, and the names the plugin derives, are distinct.
func (s *suite) migGeometry(g *gpu) Result {
	current, pending, ret := g.dev.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		return Result{Check: CheckMIGGeometry, GPU: g.index, Status: Skip, Message: "no MIG: GetMigMode answers " + s.errorString(ret)}
	case ret != nvml.SUCCESS:
		return Result{Check: CheckMIGGeometry, GPU: g.index, Status: Fail, Message: "GetMigMode: " + s.errorString(ret)}
	}
	g.migCapable, g.migOn = true, current == nvml.DEVICE_MIG_ENABLE
	var p problems
	for _, m := range []int{current, pending} {
		if m != nvml.DEVICE_MIG_DISABLE && m != nvml.DEVICE_MIG_ENABLE {
			p.add("GetMigMode answers mode %d", m)
		}
	}
	type profile struct {
		index int
		info  nvml.GpuInstanceProfileInfo
		pls   []nvml.GpuInstancePlacement
	}
	var profiles []profile
	end := -1
	for index := 0; index < maxProfileIndex && end < 0; index++ {
		info, ret := g.dev.GetGpuInstanceProfileInfo(index)
		switch ret {
		case nvml.ERROR_INVALID_ARGUMENT:
			end = index
			continue
		case nvml.ERROR_NOT_SUPPORTED:
			continue
		case nvml.SUCCESS:
		default:
			p.add("GetGpuInstanceProfileInfo(%d): %s", index, s.errorString(ret))
			continue
		}
		pls, ret := g.dev.GetGpuInstancePossiblePlacements(&info)
		if ret == nvml.ERROR_NO_PERMISSION {
			// pkg/mig then gives the GPU no geometry and the plugin says
			// why: no fault of the driver's.
			return Result{Check: CheckMIGGeometry, GPU: g.index, Status: Skip,
				Message: fmt.Sprintf("MIG-capable, but NVML gives this user no placements: GetGpuInstancePossiblePlacements(profile ID %d): %s", info.Id, s.errorString(ret))}
		}
		if ret != nvml.SUCCESS {
			p.add("GetGpuInstancePossiblePlacements(profile ID %d): %s", info.Id, s.errorString(ret))
			continue
		}
		profiles = append(profiles, profile{index, info, pls})
	}
	if end < 0 {
		p.add("GetGpuInstanceProfileInfo answers no ERROR_INVALID_ARGUMENT below index %d", maxProfileIndex)
	}
	if len(profiles) == 0 && len(p) == 0 {
		return Result{Check: CheckMIGGeometry, GPU: g.index, Status: Skip,
			Message: fmt.Sprintf("MIG-capable, but GetGpuInstanceProfileInfo answers Not Supported for every index below %d: no geometry, so the plugin publishes no MIG device", end)}
	}
	memSlices, computeSlices := 0, 0
	for _, pr := range profiles {
		computeSlices = max(computeSlices, int(pr.info.SliceCount))
		for _, pl := range pr.pls {
			memSlices = max(memSlices, int(pl.Start+pl.Size))
		}
	}
	ids, names := map[uint32]int{}, map[string]int{}
	for _, pr := range profiles {
		info := pr.info
		what := fmt.Sprintf("profile index %d (ID %d)", pr.index, info.Id)
		if j, dup := ids[info.Id]; dup {
			p.add("profile indices %d and %d both have ID %d", j, pr.index, info.Id)
		}
		ids[info.Id] = pr.index
		name := mig.ProfileName(pr.index, int(info.SliceCount), info.MemorySizeMB, g.memoryBytes)
		if j, dup := names[name]; dup {
			p.add("profile indices %d and %d are both named %s", j, pr.index, name)
		}
		names[name] = pr.index
		if info.SliceCount < 1 || info.InstanceCount < 1 || info.MemorySizeMB < 1 || info.MultiprocessorCount < 1 {
			p.add("%s: %d compute slices, %d instances, %d MiB, %d SMs", what, info.SliceCount, info.InstanceCount, info.MemorySizeMB, info.MultiprocessorCount)
			continue
		}
		p = append(p, checkPlacements(what, info, pr.pls, memSlices, computeSlices, g.memoryBytes)...)
	}
	if len(p) > 0 {
		return p.result(CheckMIGGeometry, g.index, "")
	}
	// What the plugin reads, from the same answers.
	model, err := mig.Read(g.dev, g.name, g.memoryBytes)
	if err != nil {
		p.add("pkg/mig reads no geometry from answers that hold together: %v", err)
		return p.result(CheckMIGGeometry, g.index, "")
	}
	if len(model.Profiles) != len(profiles) || model.MemorySlices != memSlices || model.ComputeSlices != computeSlices {
		p.add("pkg/mig reads %d profiles on %d memory and %d compute slices, NVML answers %d on %d and %d",
			len(model.Profiles), model.MemorySlices, model.ComputeSlices, len(profiles), memSlices, computeSlices)
	}
	g.geometry = &geometry{model: model}
	mode := "off"
	if g.migOn {
		mode = "on"
	}
	var listed []string
	for _, pr := range model.Profiles {
		listed = append(listed, fmt.Sprintf("%s (ID %d) x%d %s", pr.Name, pr.ID, pr.MaxInstances, placementsString(pr.Placements)))
	}
	return p.result(CheckMIGGeometry, g.index, fmt.Sprintf("MIG mode %s; %d memory slices, %d compute slices; profiles until index %d: %s",
		mode, memSlices, computeSlices, end, strings.Join(listed, ", ")))
}

// checkPlacements checks one profile's placements against its info.
func checkPlacements(what string, info nvml.GpuInstanceProfileInfo, pls []nvml.GpuInstancePlacement, memSlices, computeSlices int, memoryBytes uint64) problems {
	var p problems
	if len(pls) == 0 {
		p.add("%s: no placement", what)
		return p
	}
	size := int(pls[0].Size)
	starts := make([]int, 0, len(pls))
	for _, pl := range pls {
		start := int(pl.Start)
		switch {
		case int(pl.Size) != size:
			p.add("%s: placements of sizes %d and %d", what, size, pl.Size)
		case size < 1 || start%size != 0:
			p.add("%s: placement {%d}:%d does not start at a multiple of its size", what, start, size)
		case start+size > mig.MaxMemorySlices:
			p.add("%s: placement {%d}:%d lies past the %d memory slices a GPU publishes", what, start, size, mig.MaxMemorySlices)
		case slices.Contains(starts, start):
			p.add("%s: placement {%d}:%d is listed twice", what, start, size)
		}
		starts = append(starts, start)
	}
	if len(p) > 0 {
		return p
	}
	if int(info.SliceCount) > size {
		p.add("%s: %d compute slices on placements of %d memory slices", what, info.SliceCount, size)
	}
	// The profile's share of the GPU's memory, rounded up to memory
	// slices, is the size of its placements (1g.18gb: 16384 of 143771 MiB,
	// one of eight slices; 1g.35gb: 33280 MiB, two).
	if memoryBytes > 0 {
		share := (uint64(memSlices)*info.MemorySizeMB<<20 + memoryBytes - 1) / memoryBytes
		if share != uint64(size) {
			p.add("%s: %d MiB is %d of the GPU's %d memory slices, but its placements are %s", what, info.MemorySizeMB, share, memSlices, nvmlPlacementsString(pls))
		}
	}
	fit := disjoint(starts, size)
	if int(info.InstanceCount) > fit {
		p.add("%s: %d instances, but only %d fit on its placements %s at once", what, info.InstanceCount, fit, nvmlPlacementsString(pls))
	}
	if int(info.InstanceCount)*int(info.SliceCount) > computeSlices {
		p.add("%s: %d instances of %d compute slices take more than the GPU's %d", what, info.InstanceCount, info.SliceCount, computeSlices)
	}
	return p
}

// disjoint is how many placements of one size, aligned to it, fit
// without sharing a slice: the distinct starts, as aligned placements of
// one size either coincide or do not overlap.
func disjoint(starts []int, size int) int {
	n, next := 0, -1
	for _, st := range slices.Sorted(slices.Values(starts)) {
		if st >= next {
			n++
			next = st + size
		}
	}
	return n
}

func placementsString(pls []mig.Placement) string {
	starts := make([]string, 0, len(pls))
	for _, pl := range pls {
		starts = append(starts, fmt.Sprint(pl.Start))
	}
	if len(pls) == 0 {
		return "{}"
	}
	return fmt.Sprintf("{%s}:%d", strings.Join(starts, ","), pls[0].Size)
}

func nvmlPlacementsString(pls []nvml.GpuInstancePlacement) string {
	out := make([]mig.Placement, 0, len(pls))
	for _, pl := range pls {
		out = append(out, mig.Placement{Start: int(pl.Start), Size: int(pl.Size)})
	}
	return placementsString(out)
}

// migInstances lists the GPU's instances as pkg/miginstance does (the
// node's survey at start, the doctor): none with MIG mode off; with it
// on, instances of the GPU's profiles at their placements, which can all
// exist at once.
func (s *suite) migInstances(g *gpu) Result {
	var p problems
	gis, err := miginstance.ListGPUInstances(g.dev)
	if err != nil {
		p.add("the plugin cannot list GPU instances: %v", err)
		return p.result(CheckMIGInstances, g.index, "")
	}
	if !g.migOn {
		if len(gis) > 0 {
			p.add("MIG mode off, yet %d GPU instances are listed", len(gis))
		}
		return p.result(CheckMIGInstances, g.index, "MIG mode off: GetGpuInstances answers none")
	}
	model := g.geometry.model
	var instances []mig.Instance
	var listed []string
	for _, gi := range gis {
		pr, err := model.ProfileByID(gi.ProfileID)
		if err != nil {
			p.add("GPU instance %d: %v", gi.ID, err)
			continue
		}
		instances = append(instances, mig.Instance{Profile: pr, Placement: gi.Placement})
		listed = append(listed, fmt.Sprintf("GI %d %s@%s", gi.ID, pr.Name, gi.Placement))
	}
	if err := model.Coexist(instances); err != nil {
		p.add("the GPU instances NVML lists cannot exist together: %v", err)
	}
	return p.result(CheckMIGInstances, g.index, fmt.Sprintf("MIG mode on, %d GPU instances: %s", len(gis), strings.Join(listed, ", ")))
}
