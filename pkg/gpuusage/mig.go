package gpuusage

// On a GPU in MIG mode NVML answers for each MIG device (a compute
// instance, with a handle and a MIG-<uuid> of its own): its memory and
// its processes. The GPU's handle gives no per-process memory for the
// instances to a caller without privileges, and neither handle gives a
// MIG device's utilization (DCGM's profiling metrics do), so on such a GPU
// the processes are read from its MIG devices, each tagged with its
// instance, and carry no SM share.

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// Instance is one MIG device of a GPU at one sample.
type Instance struct {
	// UUID is the MIG device's, MIG-….
	UUID string
	// GPUInstance is the ID of its GPU instance; Placement the memory
	// slices that holds.
	GPUInstance int
	Placement   mig.Placement
	// MemoryUsedBytes and MemoryTotalBytes are the instance's memory.
	MemoryUsedBytes  uint64
	MemoryTotalBytes uint64
}

// inMIGMode reports whether a GPU runs in MIG mode; a GPU that cannot
// tell (no MIG support) does not.
func inMIGMode(dev nvml.Device) bool {
	current, _, ret := dev.GetMigMode()
	return ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE
}

// sampleMIG reads a MIG-mode GPU's MIG devices and their processes.
func (s *Sampler) sampleMIG(dev nvml.Device, g GPU) ([]*Instance, []Process, error) {
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("GPU %d MIG devices: %s", g.Index, s.lib.ErrorString(ret))
	}
	var instances []*Instance
	var procs []Process
	for i := 0; i < n; i++ {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			// The slots are the most the GPU may have; those past its
			// MIG devices are empty.
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nil, fmt.Errorf("GPU %d MIG device %d: %s", g.Index, i, s.lib.ErrorString(ret))
		}
		in, ps, err := s.sampleInstance(dev, md)
		if err != nil {
			return nil, nil, fmt.Errorf("GPU %d MIG device %d: %w", g.Index, i, err)
		}
		if in == nil {
			continue
		}
		instances = append(instances, in)
		procs = append(procs, ps...)
	}
	return instances, procs, nil
}

// gone reports whether a MIG device's call failed because the instance is
// gone: destroyed (a claim unprepared) between the list and the call.
func gone(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT
}

// sampleInstance reads one MIG device: nil, and no error, for one
// destroyed meanwhile, which is no fault of the GPU's.
func (s *Sampler) sampleInstance(parent, md nvml.Device) (*Instance, []Process, error) {
	in := &Instance{}
	failed := func(what string, ret nvml.Return) (*Instance, []Process, error) {
		if gone(ret) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("%s%s: %s", in.UUID, what, s.lib.ErrorString(ret))
	}
	var ret nvml.Return
	if in.UUID, ret = md.GetUUID(); ret != nvml.SUCCESS {
		return failed("UUID", ret)
	}
	if in.GPUInstance, ret = md.GetGpuInstanceId(); ret != nvml.SUCCESS {
		return failed(": GPU instance ID", ret)
	}
	gi, ret := parent.GetGpuInstanceById(in.GPUInstance)
	if ret != nvml.SUCCESS {
		return failed(fmt.Sprintf(": GPU instance %d", in.GPUInstance), ret)
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return failed(fmt.Sprintf(": GPU instance %d", in.GPUInstance), ret)
	}
	in.Placement = mig.Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}
	mem, ret := md.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return failed(" memory", ret)
	}
	in.MemoryUsedBytes, in.MemoryTotalBytes = mem.Used, mem.Total
	running, ret := md.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return failed(" processes", ret)
	}
	procs := make([]Process, 0, len(running))
	for _, p := range running {
		proc := s.process(p, 0)
		proc.Instance = in
		procs = append(procs, proc)
	}
	return in, procs, nil
}
