package simnode

import (
	"fmt"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// A simulated GPU keeps its compute mode (NVML's SetComputeMode and
// GetComputeMode) and its time slice, and records every change, so that a
// test can tell what the plugin did to the hardware and in what order.

// describeModes answers for the GPU's persistence mode, which nothing
// here changes: on, as on a node the plugin serves. (Its MIG mode is
// mig.go's.) A check that the plugin leaves it as it is reads it on a
// simulated node as on a real one.
func describeModes(d *mock.Device) {
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
}

// SharingChange is one change of a GPU's sharing settings.
type SharingChange struct {
	GPU int
	// What is "computeMode" or "timeSlice".
	What  string
	Value string
}

// sharing is the GPUs' compute modes and the changes made to their
// sharing settings, in order.
type sharing struct {
	states *gpuStates

	mu      sync.Mutex
	modes   map[int]nvml.ComputeMode
	changes []SharingChange
}

func newSharing(states *gpuStates) *sharing {
	return &sharing{states: states, modes: map[int]nvml.ComputeMode{}}
}

func (s *sharing) setComputeMode(i int, mode nvml.ComputeMode) nvml.Return {
	if ret := s.states.failure(i); ret != nvml.SUCCESS {
		return ret
	}
	if mode != nvml.COMPUTEMODE_DEFAULT && mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS && mode != nvml.COMPUTEMODE_PROHIBITED {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modes[i] = mode
	s.changes = append(s.changes, SharingChange{GPU: i, What: "computeMode", Value: ComputeModeName(mode)})
	return nvml.SUCCESS
}

func (s *sharing) computeMode(i int) (nvml.ComputeMode, nvml.Return) {
	if ret := s.states.failure(i); ret != nvml.SUCCESS {
		return 0, ret
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.modes[i], nvml.SUCCESS
}

// SetTimeSlice sets GPU i's time slice, as nvidia-smi compute-policy
// --set-timeslice does on a real GPU (interval 0 Default … 3 Long).
func (s *sharing) SetTimeSlice(i, interval int) error {
	if i < 0 || i >= s.states.count {
		return fmt.Errorf("no GPU %d", i)
	}
	if ret := s.states.failure(i); ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: %s", i, nvmlErrorString(ret))
	}
	if interval < 0 || interval > 3 {
		return fmt.Errorf("time slice %d is not 0-3", interval)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changes = append(s.changes, SharingChange{GPU: i, What: "timeSlice", Value: fmt.Sprint(interval)})
	return nil
}

// SharingChanges returns the changes made so far, in order.
func (s *sharing) SharingChanges() []SharingChange {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.changes)
}

// ComputeMode is GPU i's compute mode now.
func (s *sharing) ComputeMode(i int) nvml.ComputeMode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.modes[i]
}

// ComputeModeName names a compute mode as nvidia-smi does
// (inventory.ComputeModeName), for tests that report a simulated GPU's.
func ComputeModeName(m nvml.ComputeMode) string { return inventory.ComputeModeName(m) }
