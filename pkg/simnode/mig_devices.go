package simnode

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// A compute instance is a MIG device: an NVML device handle of its own,
// with a MIG-<uuid> UUID, that answers for its share of the GPU and
// leads back to its parent.

// nextMIGUUID makes a MIG device's UUID. It counts every compute
// instance the node has made, so that an instance destroyed and made
// again at the same IDs has a new UUID: code must read a MIG device's UUID
// after making it, never work it out.
func (n *Node) nextMIGUUID(gpu, gi, ci int) string {
	n.migSerial++
	sum := sha256.Sum256(fmt.Appendf(nil, "kyb-simulated-mig/%s/%d/%d/%d", n.uuids[gpu], gi, ci, n.migSerial))
	return fmt.Sprintf("MIG-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// newDevice is the compute instance's MIG device handle.
func (ci *simCI) newDevice() *mock.Device {
	gi := ci.gi
	g := gi.gpu
	mu := &g.n.migMu
	d := &mock.Device{}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) {
		if ret := ci.enter(CallIsMigDeviceHandle); ret != nvml.SUCCESS {
			return false, ret
		}
		defer mu.Unlock()
		return true, nvml.SUCCESS
	}
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) {
		if ret := ci.enter(CallGetDeviceHandleFromMigDeviceHandle); ret != nvml.SUCCESS {
			return nil, ret
		}
		defer mu.Unlock()
		return g.parent, nvml.SUCCESS
	}
	d.GetUUIDFunc = func() (string, nvml.Return) {
		if ret := ci.enter(CallMigDeviceGetUUID); ret != nvml.SUCCESS {
			return "", ret
		}
		defer mu.Unlock()
		return ci.uuid, nvml.SUCCESS
	}
	// The calls below are not in the fault list: they only describe.
	alive := func() nvml.Return {
		if ret := g.n.failure(g.index); ret != nvml.SUCCESS {
			return ret
		}
		mu.Lock()
		defer mu.Unlock()
		if ci.gone {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	}
	d.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return gi.id, alive() }
	d.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return ci.id, alive() }
	d.GetNameFunc = func() (string, nvml.Return) { return g.product + " MIG " + gi.profile.Name, alive() }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if ret := alive(); ret != nvml.SUCCESS {
			return nvml.Memory{}, ret
		}
		total := gi.profile.MemoryMiB << 20
		var used uint64
		for _, p := range g.n.instanceProcesses(g.index, gi.id, ci.id) {
			used += p.UsedGpuMemory
		}
		used = min(used, total)
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	// A MIG device lists its processes; NVML has no utilization of one
	// (DCGM's profiling metrics do).
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		if ret := alive(); ret != nvml.SUCCESS {
			return nil, ret
		}
		return g.n.instanceProcesses(g.index, gi.id, ci.id), nvml.SUCCESS
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED }
	d.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount:       uint32(ci.profile.sms),
			GpuInstanceSliceCount:     uint32(gi.profile.ComputeSlices),
			ComputeInstanceSliceCount: uint32(ci.profile.slices),
			MemorySizeMB:              gi.profile.MemoryMiB,
		}, alive()
	}
	return d
}

// maxMigDeviceCount is 0 with MIG off, as nvml.h says, else one MIG
// device per compute slice.
func (g *migGPU) maxMigDeviceCount() (int, nvml.Return) {
	if ret := g.enter(CallGetMaxMigDeviceCount); ret != nvml.SUCCESS {
		return 0, ret
	}
	g.n.migMu.Lock()
	defer g.n.migMu.Unlock()
	if g.enabledLocked() != nvml.SUCCESS {
		return 0, nvml.SUCCESS
	}
	return g.model.ComputeSlices, nvml.SUCCESS
}

func (g *migGPU) migDeviceByIndex(i int) (nvml.Device, nvml.Return) {
	if ret := g.enter(CallGetMigDeviceHandleByIndex); ret != nvml.SUCCESS {
		return nil, ret
	}
	g.n.migMu.Lock()
	defer g.n.migMu.Unlock()
	if ret := g.enabledLocked(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if i < 0 || i >= g.model.ComputeSlices {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	cis := g.liveCIsLocked()
	if i >= len(cis) {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return cis[i].device, nvml.SUCCESS
}

// migDeviceByUUID finds a live MIG device, as nvmlDeviceGetHandleByUUID
// does for a MIG- UUID.
func (n *Node) migDeviceByUUID(uuid string) (*simCI, bool) {
	if !strings.HasPrefix(uuid, "MIG-") {
		return nil, false
	}
	n.migMu.Lock()
	defer n.migMu.Unlock()
	for _, g := range sortedByID(n.mig) {
		for _, ci := range g.liveCIsLocked() {
			if strings.EqualFold(ci.uuid, uuid) {
				return ci, true
			}
		}
	}
	return nil, false
}
