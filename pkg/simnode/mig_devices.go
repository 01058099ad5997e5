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

// nextUUID makes a MIG device's UUID. It counts every compute instance
// the node has made, so that an instance destroyed and made again at the
// same IDs has a new UUID: code must read a MIG device's UUID after making
// it, never work it out. It is called under the MIG lock.
func (m *migNode) nextUUID(gpu, gi, ci int) string {
	m.serial++
	sum := sha256.Sum256(fmt.Appendf(nil, "kyb-simulated-mig/%s/%d/%d/%d", m.uuids[gpu], gi, ci, m.serial))
	return fmt.Sprintf("MIG-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// newDevice is the compute instance's MIG device handle.
func (ci *simCI) newDevice() *mock.Device {
	gi := ci.gi
	g, gone := gi.gpu, &ci.gone
	d := &mock.Device{
		IsMigDeviceHandleFunc: func() (bool, nvml.Return) {
			return answer(g, CallIsMigDeviceHandle, gone, func() (bool, nvml.Return) { return true, nvml.SUCCESS })
		},
		GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) {
			return answer(g, CallGetDeviceHandleFromMigDeviceHandle, gone, func() (nvml.Device, nvml.Return) { return g.parent, nvml.SUCCESS })
		},
		GetUUIDFunc: func() (string, nvml.Return) {
			return answer(g, CallMigDeviceGetUUID, gone, func() (string, nvml.Return) { return ci.uuid, nvml.SUCCESS })
		},
	}
	ci.describe(d)
	return d
}

// describe answers the calls of the compute instance's MIG device that
// only describe it, which are not in the fault list.
func (ci *simCI) describe(d *mock.Device) {
	gi := ci.gi
	g := gi.gpu
	alive := func() nvml.Return {
		if ret := g.m.states.failure(g.index); ret != nvml.SUCCESS {
			return ret
		}
		g.m.mu.Lock()
		defer g.m.mu.Unlock()
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
		for _, p := range g.m.procs.instanceProcesses(g.index, gi.id, ci.id) {
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
		return g.m.procs.instanceProcesses(g.index, gi.id, ci.id), nvml.SUCCESS
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
}

// maxMigDeviceCount is 0 with MIG off, as nvml.h says, else one MIG
// device per compute slice.
func (g *migGPU) maxMigDeviceCount() (int, nvml.Return) {
	return answer(g, CallGetMaxMigDeviceCount, nil, func() (int, nvml.Return) {
		if g.enabledLocked() != nvml.SUCCESS {
			return 0, nvml.SUCCESS
		}
		return g.model.ComputeSlices, nvml.SUCCESS
	})
}

func (g *migGPU) migDeviceByIndex(i int) (nvml.Device, nvml.Return) {
	return answer(g, CallGetMigDeviceHandleByIndex, nil, func() (nvml.Device, nvml.Return) {
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
	})
}

// deviceByUUID finds a live MIG device, as nvmlDeviceGetHandleByUUID does
// for a MIG- UUID.
func (m *migNode) deviceByUUID(uuid string) (*simCI, bool) {
	if !strings.HasPrefix(uuid, "MIG-") {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range sortedByID(m.gpus) {
		for _, ci := range g.liveCIsLocked() {
			if strings.EqualFold(ci.uuid, uuid) {
				return ci, true
			}
		}
	}
	return nil, false
}
