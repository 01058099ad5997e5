package simnode

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// gpuStates is what each GPU's driver says beside the GPU's description:
// the error it answers device calls with (a GPU lost or failing), and its
// recovery action (recovery.go). Every other part of the node asks it
// before it answers for a GPU.
type gpuStates struct {
	// count is the node's number of GPUs.
	count int

	mu sync.Mutex
	// errs are the errors GPUs answer device calls with.
	errs map[int]nvml.Return
	// recovery is what each GPU's driver says of its recovery.
	recovery map[int]recoveryState
}

func newGPUStates(count int) *gpuStates {
	return &gpuStates{count: count, errs: map[int]nvml.Return{}, recovery: map[int]recoveryState{}}
}

// check refuses an index that is not one of the node's GPUs.
func (s *gpuStates) check(i int) error {
	if i < 0 || i >= s.count {
		return fmt.Errorf("simulated node has no GPU %d (%d GPUs)", i, s.count)
	}
	return nil
}

// SetLost makes GPU i answer ERROR_GPU_IS_LOST (or answer again), as a GPU
// that fell off the bus does.
func (s *gpuStates) SetLost(i int, lost bool) error {
	ret := nvml.SUCCESS
	if lost {
		ret = nvml.ERROR_GPU_IS_LOST
	}
	return s.SetError(i, ret)
}

// SetError makes GPU i answer its identity and memory calls with ret
// (nvml.SUCCESS: answer normally again), as a GPU that the driver cannot
// reach does.
func (s *gpuStates) SetError(i int, ret nvml.Return) error {
	if err := s.check(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ret == nvml.SUCCESS {
		delete(s.errs, i)
	} else {
		s.errs[i] = ret
	}
	return nil
}

func (s *gpuStates) failure(i int) nvml.Return {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ret, ok := s.errs[i]; ok {
		return ret
	}
	return nvml.SUCCESS
}
