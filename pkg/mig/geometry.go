package mig

import (
	"fmt"
	"slices"
	"strings"
)

// Placement is where a GPU instance sits on the GPU's memory slices: Size
// slices from Start, as nvidia-smi writes it, {Start}:Size.
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

func (p Placement) String() string { return fmt.Sprintf("{%d}:%d", p.Start, p.Size) }

// End is the first memory slice after the placement.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps says whether two placements share a memory slice.
func Overlaps(a, b Placement) bool {
	return a.Start < b.End() && b.Start < a.End()
}

// Profile is a GPU-instance profile of one GPU model, as NVML describes
// it (nvmlGpuInstanceProfileInfo_t and the profile's possible placements).
type Profile struct {
	// ID is the profile ID NVML and nvidia-smi use (19 for 1g.10gb on an
	// H100): GpuInstanceProfileInfo.Id, and what CreateGpuInstance takes.
	ID int `json:"id"`
	// Index is the NVML_GPU_INSTANCE_PROFILE_* constant that
	// nvmlDeviceGetGpuInstanceProfileInfo takes to describe the profile.
	Index int `json:"index"`
	// Name is the profile as `nvidia-smi mig -lgip` prints it, less its
	// "MIG " prefix: 1g.10gb, 1g.10gb+me (read.go says how it is made).
	Name string `json:"name"`
	// MemorySlices is the size of every placement; ComputeSlices the
	// compute slices (the "1g" of the name) the instance takes.
	MemorySlices  int    `json:"memorySlices"`
	ComputeSlices int    `json:"computeSlices"`
	MemoryMiB     uint64 `json:"memoryMiB"`
	SMs           int    `json:"sms"`
	// The engines an instance of the profile holds.
	CopyEngines int `json:"copyEngines"`
	Decoders    int `json:"decoders"`
	Encoders    int `json:"encoders"`
	JPEGs       int `json:"jpegs"`
	OFAs        int `json:"ofas"`
	// MaxInstances is how many instances of the profile a GPU can hold at
	// once, whatever else is free.
	MaxInstances int `json:"maxInstances"`
	// Placements are where an instance of the profile may start, in
	// NVML's order.
	Placements []Placement `json:"placements"`
}

// Model is a GPU model's MIG geometry.
type Model struct {
	// Name is the GPU's product as NVML names it: NVIDIA H100 80GB HBM3.
	Name string `json:"name"`
	// MemorySlices and ComputeSlices are the GPU's whole: 8 and 7 on an
	// A100 or an H100, 4 and 4 on an A30.
	MemorySlices  int `json:"memorySlices"`
	ComputeSlices int `json:"computeSlices"`
	// Profiles are the GPU-instance profiles, in nvidia-smi's order: by
	// compute slices, then memory, then NVML index.
	Profiles []Profile `json:"profiles"`
}

// Profile returns the model's profile by name, as nvidia-smi prints it.
func (m Model) Profile(name string) (Profile, error) {
	for _, p := range m.Profiles {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("MIG profile %q is not one of %s's: %s", name, m.Name, strings.Join(m.ProfileNames(), ", "))
}

// ProfileByID returns the model's profile with NVML profile ID id.
func (m Model) ProfileByID(id int) (Profile, error) {
	for _, p := range m.Profiles {
		if p.ID == id {
			return p, nil
		}
	}
	ids := make([]string, 0, len(m.Profiles))
	for _, p := range m.Profiles {
		ids = append(ids, fmt.Sprintf("%d (%s)", p.ID, p.Name))
	}
	return Profile{}, fmt.Errorf("MIG profile ID %d is not one of %s's: %s", id, m.Name, strings.Join(ids, ", "))
}

// ProfileNames lists the model's profiles, in nvidia-smi's order.
func (m Model) ProfileNames() []string {
	names := make([]string, 0, len(m.Profiles))
	for _, p := range m.Profiles {
		names = append(names, p.Name)
	}
	return names
}

// Instance is a GPU instance of a profile at a placement, made or
// planned.
type Instance struct {
	Profile   Profile
	Placement Placement
}

func (i Instance) String() string { return i.Profile.Name + "@" + i.Placement.String() }

// Instances enumerates every instance the model could hold, one per
// profile and placement, profiles in nvidia-smi's order.
func (m Model) Instances() []Instance {
	var out []Instance
	for _, p := range m.Profiles {
		for _, pl := range p.Placements {
			out = append(out, Instance{Profile: p, Placement: pl})
		}
	}
	return out
}

// Coexist says whether the instances can exist on one GPU of the model at
// the same time: each is a profile of the model at one of its placements,
// no two share a memory slice, no profile has more than its maximum, and
// the compute slices add up to at most the GPU's. The error names the
// first rule broken and the instances that break it.
func (m Model) Coexist(instances []Instance) error {
	counts := map[int]int{}
	compute := 0
	for i, a := range instances {
		p, err := m.ProfileByID(a.Profile.ID)
		if err != nil {
			return fmt.Errorf("instance %d (%s): %w", i, a, err)
		}
		if p.Name != a.Profile.Name {
			return fmt.Errorf("instance %d (%s): profile ID %d is %s on %s", i, a, p.ID, p.Name, m.Name)
		}
		if !slices.Contains(p.Placements, a.Placement) {
			return fmt.Errorf("instance %d (%s): %s cannot start at %s on %s; its placements are %s", i, a, p.Name, a.Placement, m.Name, formatPlacements(p.Placements))
		}
		for j, b := range instances[:i] {
			if Overlaps(a.Placement, b.Placement) {
				return fmt.Errorf("instance %d (%s) overlaps instance %d (%s) on memory slices", i, a, j, b)
			}
		}
		counts[p.ID]++
		if counts[p.ID] > p.MaxInstances {
			return fmt.Errorf("instance %d (%s): %s allows at most %d instance(s) of %s", i, a, m.Name, p.MaxInstances, p.Name)
		}
		compute += p.ComputeSlices
		if compute > m.ComputeSlices {
			return fmt.Errorf("instance %d (%s): the instances take %d compute slices, %s has %d", i, a, compute, m.Name, m.ComputeSlices)
		}
	}
	return nil
}

// formatPlacements writes placements as nvidia-smi -lgipp does: {0,2,4}:2.
func formatPlacements(ps []Placement) string {
	if len(ps) == 0 {
		return "none"
	}
	starts := make([]string, 0, len(ps))
	for _, p := range ps {
		starts = append(starts, fmt.Sprint(p.Start))
	}
	return fmt.Sprintf("{%s}:%d", strings.Join(starts, ","), ps[0].Size)
}
