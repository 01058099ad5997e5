package simnode

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// A simulated MIG GPU (one with a MIG table, mig_tables.go, or a MIG
// geometry in its NodeTopology entry) partitions itself as the real one
// does, through the same NVML calls: its profiles and placements, MIG
// mode, GPU instances at placements, compute instances inside them, and
// the MIG device handles and UUIDs of the compute instances. go-nvml's own
// mock server does not do this faithfully (it never refuses an
// overlapping placement, destroys a GPU instance that still has compute
// instances, gives compute instances the parent's UUID, and lacks several
// calls), so the simulation keeps its own state.
//
// What it models, from nvml.h (go-nvml v0.13.0-1) and the MIG user guide:
//   - MIG mode: Hopper and later switch at once; Ampere only records the
//     pending mode and answers activationStatus ERROR_RESET_REQUIRED until
//     ResetGPU. While processes run on the GPU, or GPU instances exist
//     and MIG is being turned off, activation fails with ERROR_IN_USE
//     (nvmlDeviceSetMigMode: "if device unbind fails because the device
//     isn't idle, NVML_ERROR_IN_USE would be returned") and only the
//     pending mode changes.
//   - Profiles: GetGpuInstanceProfileInfo answers for the indices of the
//     GPU's profiles, ERROR_NOT_SUPPORTED for the other indices below
//     NVML_GPU_INSTANCE_PROFILE_COUNT and ERROR_INVALID_ARGUMENT from it
//     on, with MIG mode on or off (as the real H200 did);
//     GetGpuInstancePossiblePlacements finds the profile by the info's
//     Id, as real NVML does, and answers ERROR_NO_PERMISSION to a process
//     that is neither root nor holds a MIG capability ("Requires
//     privileged user").
//   - GPU instances: with MIG off, ERROR_NOT_SUPPORTED; a placement that
//     is not the profile's, ERROR_INVALID_ARGUMENT; one that overlaps an
//     instance, or a profile at its maximum, ERROR_INSUFFICIENT_RESOURCES.
//     A GPU instance's ID follows its memory range (on eight slices: 0
//     for all of them, 1-2 the halves, 3-6 the quarters, 7-14 single
//     slices; on four: 0, 1-2, 3-6), as real GPUs hand them out (3g at
//     {4}:4 is GI 2, 2g at {0}:2 is GI 3), so that the capability minors
//     follow as well.
//   - Compute instances: the profiles a GPU instance of each size offers,
//     IDs from 0; ERROR_INSUFFICIENT_RESOURCES when the compute slices are
//     taken. A GPU instance with compute instances refuses Destroy with
//     ERROR_IN_USE. Handles of destroyed instances answer
//     ERROR_INVALID_ARGUMENT.
//   - MIG devices: one per compute instance, UUID MIG-<uuid>, listed by
//     GetMigDeviceHandleByIndex in GPU-instance then compute-instance ID
//     order; the mig-minors file and capability device nodes (mig_caps.go).
//
// What it does not: processes inside a MIG device (so neither Destroy
// answers ERROR_IN_USE for one), compute-instance placements as NVML
// chooses them (the lowest free aligned start here), media-engine and
// copy-engine counts of compute instances, vGPU, and the geometry of MIG
// products without a table or a NodeTopology geometry (an A30 or a B200
// left as a product name: their MIG calls answer ERROR_NOT_SUPPORTED,
// GetMigMode aside, which is how a GPU whose geometry NVML will not give
// looks to the plugin).

// migProducts are the models with MIG, as NVIDIA lists them.
var migProducts = []string{"A100", "A30", "H100", "H200", "H800", "B200", "GB200", "RTX PRO 6000"}

// migNode is the MIG state of the node's GPUs (their modes and
// instances, and the count of compute instances made, which MIG UUIDs
// derive from) and what it asks of the rest of the node: the faults a
// test set on calls, each GPU's failure, the processes that keep a GPU
// busy, and whether the process may configure MIG. One lock guards it
// all: a call on a GPU or compute instance reads its GPU's state.
type migNode struct {
	// uuids are the GPUs' UUIDs by index.
	uuids  []string
	calls  *callFaults
	states *gpuStates
	procs  *processes
	dev    *devNodes

	mu     sync.Mutex
	gpus   map[int]*migGPU
	serial int
}

// migGPU is one simulated GPU's MIG state, guarded by migNode.mu.
type migGPU struct {
	m      *migNode
	index  int
	minor  int
	parent *mock.Device
	// product is the GPU's name, which a MIG device's name starts with.
	product string
	// capable: the GPU has MIG, so GetMigMode answers.
	capable bool
	// model is the GPU's geometry, nil where a capable product has no
	// table and its NodeTopology entry none either.
	model *mig.Model
	// resetless: Hopper and later activate a MIG mode change at once.
	resetless        bool
	current, pending int
	gis              map[int]*simGI
}

// attach answers the MIG calls of GPU g, served by device d.
func (m *migNode) attach(d *mock.Device, g v1alpha1.SimulatedGPU) {
	gpu := &migGPU{
		m: m, index: g.Index, minor: *g.Minor, parent: d, product: g.ProductName,
		capable:   g.MIG != nil || slices.ContainsFunc(migProducts, func(p string) bool { return strings.Contains(g.ProductName, p) }),
		resetless: g.Architecture != "ampere",
		gis:       map[int]*simGI{},
	}
	switch t, ok := tableForProduct(g.ProductName); {
	case g.MIG != nil:
		gpu.model = geometry(g.ProductName, uint64(g.MemoryMiB)<<20, *g.MIG)
	case ok && gpu.capable:
		gpu.model = geometry(g.ProductName, uint64(g.MemoryMiB)<<20, t.mig)
	}
	m.mu.Lock()
	m.gpus[g.Index] = gpu
	m.mu.Unlock()

	d.GetMigModeFunc = gpu.getMigMode
	d.SetMigModeFunc = gpu.setMigMode
	d.GetGpuInstanceProfileInfoFunc = gpu.profileInfo
	d.GetGpuInstancePossiblePlacementsFunc = gpu.possiblePlacements
	d.CreateGpuInstanceFunc = gpu.createGPUInstance
	d.CreateGpuInstanceWithPlacementFunc = gpu.createGPUInstanceAt
	d.GetGpuInstancesFunc = gpu.gpuInstances
	d.GetGpuInstanceByIdFunc = gpu.gpuInstanceByID
	d.GetMaxMigDeviceCountFunc = gpu.maxMigDeviceCount
	d.GetMigDeviceHandleByIndexFunc = gpu.migDeviceByIndex
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) {
		if ret := m.calls.answer(CallIsMigDeviceHandle); ret != nvml.SUCCESS {
			return false, ret
		}
		return false, nvml.SUCCESS
	}
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) {
		if ret := m.calls.answer(CallGetDeviceHandleFromMigDeviceHandle); ret != nvml.SUCCESS {
			return nil, ret
		}
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
}

// answer is the prologue of every MIG call on a GPU, on one of its GPU
// or compute instances, or on a MIG device: the call's injected fault,
// the permission a call that configures MIG needs, and the GPU's own
// failure come first; then fn answers under the MIG lock, unless the
// instance the handle is of is gone (destroyed since), which answers
// ERROR_INVALID_ARGUMENT. gone is nil for a call on the GPU itself.
func answer[T any](g *migGPU, call Call, gone *bool, fn func() (T, nvml.Return)) (T, nvml.Return) {
	var none T
	if ret := g.enter(call); ret != nvml.SUCCESS {
		return none, ret
	}
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	if gone != nil && *gone {
		return none, nvml.ERROR_INVALID_ARGUMENT
	}
	return fn()
}

// answerCode is answer for a call whose only answer is its code.
func answerCode(g *migGPU, call Call, gone *bool, fn func() nvml.Return) nvml.Return {
	_, ret := answer(g, call, gone, func() (struct{}, nvml.Return) { return struct{}{}, fn() })
	return ret
}

// enter answers a MIG call's injected fault or the GPU's own failure,
// nvml.SUCCESS when there is neither.
func (g *migGPU) enter(call Call) nvml.Return {
	if ret := g.m.calls.answer(call); ret != nvml.SUCCESS {
		return ret
	}
	if slices.Contains(configCalls, call) && !g.m.dev.mayConfigureMIG() {
		return nvml.ERROR_NO_PERMISSION
	}
	if call == CallGetGpuInstancePossiblePlacements && !g.m.dev.mayReadMIGPlacements() {
		return nvml.ERROR_NO_PERMISSION
	}
	return g.m.states.failure(g.index)
}

// configCalls are the calls that need the MIG config capability
// (devnodes.go).
var configCalls = []Call{CallCreateGpuInstance, CallCreateGpuInstanceWithPlacement, CallCreateComputeInstance, CallGpuInstanceDestroy, CallComputeInstanceDestroy}

// enabledLocked is the answer to a call that needs MIG on.
func (g *migGPU) enabledLocked() nvml.Return {
	if g.model == nil || g.current != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.SUCCESS
}

func (g *migGPU) getMigMode() (int, int, nvml.Return) {
	modes, ret := answer(g, CallGetMigMode, nil, func() ([2]int, nvml.Return) {
		if !g.capable {
			return [2]int{}, nvml.ERROR_NOT_SUPPORTED
		}
		return [2]int{g.current, g.pending}, nvml.SUCCESS
	})
	return modes[0], modes[1], ret
}

// setMigMode answers activationStatus first, then the call's own return,
// as go-nvml's Device.SetMigMode does.
func (g *migGPU) setMigMode(mode int) (nvml.Return, nvml.Return) {
	activation, ret := answer(g, CallSetMigMode, nil, func() (nvml.Return, nvml.Return) {
		if !g.capable || g.model == nil {
			return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
		}
		if mode != nvml.DEVICE_MIG_DISABLE && mode != nvml.DEVICE_MIG_ENABLE {
			return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
		}
		busy := len(g.m.procs.processesOn(g.index)) > 0
		g.pending = mode
		switch {
		case mode == g.current:
			return nvml.SUCCESS, nvml.SUCCESS
		case busy, mode == nvml.DEVICE_MIG_DISABLE && len(g.gis) > 0:
			return nvml.ERROR_IN_USE, nvml.SUCCESS
		case !g.resetless:
			return nvml.ERROR_RESET_REQUIRED, nvml.SUCCESS
		}
		g.current = mode
		return nvml.SUCCESS, nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return ret, ret
	}
	return activation, ret
}

// ResetGPU resets GPU i as nvidia-smi --gpu-reset does: a pending MIG
// mode takes effect and every GPU and compute instance is gone. A GPU
// with processes on it refuses.
func (m *migNode) ResetGPU(i int) error {
	m.mu.Lock()
	g, ok := m.gpus[i]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("simulated node has no GPU %d (%d GPUs)", i, len(m.uuids))
	}
	if procs := m.procs.processesOn(i); len(procs) > 0 {
		return fmt.Errorf("reset GPU %d: in use by %d process(es)", i, len(procs))
	}
	if ret := m.states.failure(i); ret != nvml.SUCCESS {
		return fmt.Errorf("reset GPU %d: %s", i, nvmlErrorString(ret))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, gi := range g.gis {
		gi.dropLocked()
		delete(g.gis, id)
	}
	g.current = g.pending
	return nil
}
