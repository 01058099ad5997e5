package simnode

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// A real GPU keeps its MIG mode and instances when the process that made
// them dies; a simulated node lives in its process. MIGState and
// RestoreMIG carry the MIG state from one process to the next (the crash
// tests run the plugin in a child process they SIGKILL), UUIDs and the
// count they derive from included, so that the next process sees the
// same instances under the same UUIDs and makes new ones under new UUIDs.

// MIGState is the MIG state of a simulated node's GPUs.
type MIGState struct {
	// Serial counts the compute instances the node has made.
	Serial int           `json:"serial"`
	GPUs   []MIGGPUState `json:"gpus"`
}

// MIGGPUState is one GPU's MIG modes and instances.
type MIGGPUState struct {
	Index   int `json:"index"`
	Current int `json:"current"`
	Pending int `json:"pending"`
	// Instances are its GPU instances by ID.
	Instances []GPUInstanceState `json:"instances,omitempty"`
}

// GPUInstanceState is a GPU instance and its compute instances.
type GPUInstanceState struct {
	ProfileID        int                    `json:"profileID"`
	Start            int                    `json:"start"`
	Size             int                    `json:"size"`
	ComputeInstances []ComputeInstanceState `json:"computeInstances,omitempty"`
}

// ComputeInstanceState is a compute instance and its MIG device's UUID.
type ComputeInstanceState struct {
	ID int `json:"id"`
	// Profile is its NVML_COMPUTE_INSTANCE_PROFILE_* index.
	Profile int    `json:"profile"`
	Start   int    `json:"start"`
	UUID    string `json:"uuid"`
}

// MIGState returns the node's MIG state, GPUs and instances by ID.
func (m *migNode) MIGState() MIGState {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := MIGState{Serial: m.serial}
	for _, g := range sortedByID(m.gpus) {
		gs := MIGGPUState{Index: g.index, Current: g.current, Pending: g.pending}
		for _, gi := range sortedByID(g.gis) {
			is := GPUInstanceState{ProfileID: gi.profile.ID, Start: gi.placement.Start, Size: gi.placement.Size}
			for _, ci := range sortedByID(gi.cis) {
				is.ComputeInstances = append(is.ComputeInstances, ComputeInstanceState{ID: ci.id, Profile: ci.profile.index, Start: ci.start, UUID: ci.uuid})
			}
			gs.Instances = append(gs.Instances, is)
		}
		s.GPUs = append(s.GPUs, gs)
	}
	return s
}

// RestoreMIG gives a node whose GPUs have no instances yet the MIG state
// another node of the same description returned. It refuses a state its
// GPUs could not be in: an unknown GPU or profile, a placement not the
// profile's, instances that overlap, compute instances that do not fit.
func (m *migNode) RestoreMIG(s MIGState) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gpus {
		if len(g.gis) > 0 {
			return fmt.Errorf("restore MIG state: GPU %d has instances already", g.index)
		}
	}
	modes := map[int][2]int{}
	for i, g := range m.gpus {
		modes[i] = [2]int{g.current, g.pending}
	}
	for _, gs := range s.GPUs {
		if err := m.restoreGPULocked(gs); err != nil {
			// Leave no half-restored node behind.
			for i, g := range m.gpus {
				for id, gi := range g.gis {
					gi.dropLocked()
					delete(g.gis, id)
				}
				g.current, g.pending = modes[i][0], modes[i][1]
			}
			return fmt.Errorf("restore MIG state: GPU %d: %w", gs.Index, err)
		}
	}
	m.serial = s.Serial
	return nil
}

func (m *migNode) restoreGPULocked(gs MIGGPUState) error {
	g, ok := m.gpus[gs.Index]
	if !ok {
		return fmt.Errorf("the node has no such GPU (%d GPUs)", len(m.uuids))
	}
	modes := []int{nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_ENABLE}
	if !slices.Contains(modes, gs.Current) || !slices.Contains(modes, gs.Pending) {
		return fmt.Errorf("MIG mode %d (pending %d) is neither 0 nor 1", gs.Current, gs.Pending)
	}
	if (gs.Current == nvml.DEVICE_MIG_ENABLE || gs.Pending == nvml.DEVICE_MIG_ENABLE) && (!g.capable || g.model == nil) {
		return fmt.Errorf("MIG mode on a GPU without MIG (%s)", g.product)
	}
	if len(gs.Instances) > 0 && gs.Current != nvml.DEVICE_MIG_ENABLE {
		return fmt.Errorf("%d GPU instances with MIG mode off", len(gs.Instances))
	}
	g.current, g.pending = gs.Current, gs.Pending
	var instances []mig.Instance
	for _, is := range gs.Instances {
		p, err := g.model.ProfileByID(is.ProfileID)
		if err != nil {
			return err
		}
		pl := mig.Placement{Start: is.Start, Size: is.Size}
		if !slices.Contains(p.Placements, pl) {
			return fmt.Errorf("profile %s has no placement %s", p.Name, pl)
		}
		instances = append(instances, mig.Instance{Profile: p, Placement: pl})
		if err := g.model.Coexist(instances); err != nil {
			return err
		}
		gi := &simGI{gpu: g, id: giID(g.model.MemorySlices, pl), profile: p, placement: pl, cis: map[int]*simCI{}}
		gi.handle = gi.newHandle()
		if err := gi.restoreLocked(is.ComputeInstances); err != nil {
			return fmt.Errorf("GPU instance %d: %w", gi.id, err)
		}
		g.gis[gi.id] = gi
	}
	return nil
}

func (gi *simGI) restoreLocked(cis []ComputeInstanceState) error {
	used := make([]bool, gi.profile.ComputeSlices)
	for _, cs := range cis {
		cp, ok := gi.ciProfile(cs.Profile)
		if !ok {
			return fmt.Errorf("compute instance %d: no compute-instance profile %d", cs.ID, cs.Profile)
		}
		if _, dup := gi.cis[cs.ID]; dup || cs.ID < 0 {
			return fmt.Errorf("compute instance ID %d twice or negative", cs.ID)
		}
		if cs.Start < 0 || cs.Start%cp.slices != 0 || cs.Start+cp.slices > len(used) || slices.Contains(used[cs.Start:cs.Start+cp.slices], true) {
			return fmt.Errorf("compute instance %d at slice %d does not fit", cs.ID, cs.Start)
		}
		for s := cs.Start; s < cs.Start+cp.slices; s++ {
			used[s] = true
		}
		ci := &simCI{gi: gi, id: cs.ID, profile: cp, start: cs.Start, uuid: cs.UUID}
		ci.handle = ci.newHandle()
		ci.device = ci.newDevice()
		gi.cis[cs.ID] = ci
	}
	return nil
}
