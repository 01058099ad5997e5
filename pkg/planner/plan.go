// Package planner turns a node's GPU inventory and its configuration into
// groups and seats. It is pure: no I/O, no Kubernetes objects, the same
// input always gives the same plan. Both surfaces of the driver (the DRA
// kubelet plugin and the device-plugin shim) are adapters around it.
//
// A group is a set of 1, 2, 4 or 8 GPUs; a profile says the size of its
// groups and how many seats share each group. Groups are either named in
// the config or derived from the topology: for each size, the planner picks
// disjoint groups so that the weakest link inside each group is as strong as
// possible (NVLink > PCIe switch > host bridge > NUMA node > across
// sockets), then the sum of the links, then the lowest GPU indices.
package planner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// Plan is the node's groups and seats.
type Plan struct {
	// GPUs is the number of GPUs on the node.
	GPUs int
	// Policy orders the groups for the scheduler's first fit.
	Policy v1alpha1.AllocationPolicy
	// Attributes are the device attributes to publish.
	Attributes []v1alpha1.AttributeName
	// HideBlocked leaves groups that hold no seat and are blocked by an
	// overlapping group in use out of the published slices
	// (unavailableGroups: hideBlocked, opt-in).
	HideBlocked bool
	// Profiles in ascending group size (then name).
	Profiles []*Profile
	// Warnings say what the planner decided on the user's behalf.
	Warnings []string

	// links is the inventory's link matrix, kept for ordering.
	links [][]inventory.Link
}

// Profile is a seat profile with its groups.
type Profile struct {
	Name               string
	Resource           string
	Size               int
	SeatsPerGroup      int
	AllowOverprovision bool
	// Sharing is how a group's seats share its GPUs.
	Sharing v1alpha1.SharingStrategy
	// TimeSlice, for timeSlicing, is the interval applied to a group's
	// GPUs when it goes into use ("" leaves them as they are).
	TimeSlice v1alpha1.TimeSliceInterval
	// MPSComputeMode, for mps, says whether a group's daemon puts its
	// GPUs in EXCLUSIVE_PROCESS or keeps their compute mode.
	MPSComputeMode v1alpha1.MPSComputeMode
	// Sizes, for a sized mps profile, are the rules of what its claims
	// may ask (Group.Sizes); nil for any other profile.
	Sizes *v1alpha1.SizeRules
	// Groups in canonical order: by their lowest GPU index. A MIG
	// profile has none: its GPUs are in MIG (mig.go).
	Groups []*Group
	// MIG, for a MIG profile, is its GPUs and their geometry;
	// SeatsPerGroup is then the seats per GPU.
	MIG *MIGSeats
}

// Group is a set of GPUs of one profile, shared by SeatsPerGroup seats.
type Group struct {
	Name    string
	Profile *Profile
	// GPUs are the NVML indices, ascending.
	GPUs []int
	// Explicit is true for a group named in the config.
	Explicit bool
	// Weakest is the weakest link between two GPUs of the group (zero
	// value for a group of one).
	Weakest inventory.Link
	// Interconnect is the class of the weakest link (ClassNone for one GPU).
	Interconnect inventory.Class
	// NUMANode is the NUMA node all GPUs share, or -1.
	NUMANode int
	// PCIeRoot is the PCIe root all GPUs share, or "".
	PCIeRoot string
	// MemoryMiB is the memory of the group's smallest GPU: what each of
	// its GPUs has for a sized seat.
	MemoryMiB int64
}

// Seats is the number of seats of the group.
func (g *Group) Seats() int { return g.Profile.SeatsPerGroup }

// DeviceName is the group's name in the ResourceSlice: a DNS label made of
// the group and the profile, such as g01-2x.
func (g *Group) DeviceName() string {
	return strings.ToLower(g.Name) + "-" + g.Profile.Name
}

// SeatID names seat n of the group, as the device-plugin shim exports it
// and as the fallback ResourceSlices name their per-seat devices.
func (g *Group) SeatID(n int) string {
	return g.DeviceName() + "-seat-" + strconv.Itoa(n)
}

// ShimDeviceIDs are the device IDs the device-plugin shim exports for the
// plan, whatever resource names it serves them under: each seat of each
// group (SeatID) and each MIG device's name.
func (p *Plan) ShimDeviceIDs() []string {
	var out []string
	for _, prof := range p.Profiles {
		for _, g := range prof.Groups {
			for n := range prof.SeatsPerGroup {
				out = append(out, g.SeatID(n))
			}
		}
	}
	for _, d := range p.MIGDevices() {
		out = append(out, d.DeviceName())
	}
	return out
}

// GPUList renders the GPU indices as "0,1".
func (g *Group) GPUList() string {
	parts := make([]string, len(g.GPUs))
	for i, x := range g.GPUs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// SharesGPU reports whether two groups have a GPU in common.
func (g *Group) SharesGPU(o *Group) bool {
	for _, x := range g.GPUs {
		if slices.Contains(o.GPUs, x) {
			return true
		}
	}
	return false
}

// Excludes reports whether g and o can never be in use at the same time:
// they share a GPU and neither profile allows overprovisioning.
func (g *Group) Excludes(o *Group) bool {
	if g == o || g.Profile.AllowOverprovision || o.Profile.AllowOverprovision {
		return false
	}
	return g.SharesGPU(o)
}

// Groups returns every group of every profile, profiles in order.
func (p *Plan) Groups() []*Group {
	var all []*Group
	for _, prof := range p.Profiles {
		all = append(all, prof.Groups...)
	}
	return all
}

// Profile returns the profile with the given name.
func (p *Plan) Profile(name string) *Profile {
	for _, prof := range p.Profiles {
		if prof.Name == name {
			return prof
		}
	}
	return nil
}

// GroupByDevice finds a group by its device name.
func (p *Plan) GroupByDevice(device string) *Group {
	for _, g := range p.Groups() {
		if g.DeviceName() == device {
			return g
		}
	}
	return nil
}

// Overlaps returns, for every group, the groups that share a GPU with it
// (of any profile), keyed by device name. It is the matrix the issue of
// exclusivity is decided on.
func (p *Plan) Overlaps() map[string][]string {
	all := p.Groups()
	out := map[string][]string{}
	for _, g := range all {
		for _, o := range all {
			if g != o && g.SharesGPU(o) {
				out[g.DeviceName()] = append(out[g.DeviceName()], o.DeviceName())
			}
		}
	}
	return out
}

// Seats is the total number of seats of a profile.
func (prof *Profile) Seats() int {
	if prof.MIG != nil {
		n := 0
		for _, g := range prof.MIG.GPUs {
			n += g.Seats
		}
		return n
	}
	return len(prof.Groups) * prof.SeatsPerGroup
}

func (prof *Profile) String() string {
	return fmt.Sprintf("%s (%s, %d GPU(s)/group, %d seat(s)/group)", prof.Name, prof.Resource, prof.Size, prof.SeatsPerGroup)
}
