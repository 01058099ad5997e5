// Package gpuusage reads what runs on a node's GPUs: NVML's running
// processes with their memory and SM utilization, and the container each
// process belongs to, from its cgroup. What a container's seat is, and so
// whose usage it is, the plugin that holds the seats decides.
package gpuusage

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GPU is a GPU to sample.
type GPU struct {
	Index int
	UUID  string
}

// CgroupReader reads a process's /proc/PID/cgroup.
type CgroupReader interface {
	Cgroup(pid uint32) (string, error)
}

// Process is one process on one GPU at one sample.
type Process struct {
	PID         uint32
	MemoryBytes uint64
	// SMPercent is the process's share of the GPU's SM time from NVML's
	// samples newer than the previous sample, averaged (most drivers keep
	// one per process: its latest).
	SMPercent float64
	// Container is where the process runs; InPod is false when its cgroup
	// names no pod's container (or could not be read: CgroupErr).
	Container Container
	InPod     bool
	CgroupErr error
	// Instance is the MIG device the process runs in; nil on a GPU not in
	// MIG mode.
	Instance *Instance
}

// Usage is one GPU at one sample.
type Usage struct {
	GPU              GPU
	MemoryUsedBytes  uint64
	MemoryTotalBytes uint64
	SMPercent        uint32
	Processes        []Process
	// Instances are the GPU's MIG devices, in MIG mode (see mig.go).
	Instances []*Instance
	// Err is set when the GPU did not answer; the other fields are then
	// empty.
	Err error
}

// Sampler samples the GPUs. Its calls must not overlap: each sample asks
// NVML for the utilization since the previous one.
type Sampler struct {
	lib      nvml.Interface
	gpus     []GPU
	cgroups  CgroupReader
	lastSeen map[int]uint64
	// sourceErr, when set, tells why the processes' source could not be
	// read (a simulated node's processes file).
	sourceErr func() error
}

// SetSourceCheck makes SourceErr ask check why the processes' source
// could not be read.
func (s *Sampler) SetSourceCheck(check func() error) { s.sourceErr = check }

// SourceErr is why the processes' source could not be read, if it could
// not; what was read before is still sampled.
func (s *Sampler) SourceErr() error {
	if s.sourceErr == nil {
		return nil
	}
	return s.sourceErr()
}

// NewSampler samples gpus through lib, reading processes' cgroups with
// cgroups.
func NewSampler(lib nvml.Interface, gpus []GPU, cgroups CgroupReader) *Sampler {
	return &Sampler{lib: lib, gpus: gpus, cgroups: cgroups, lastSeen: map[int]uint64{}}
}

// Sample reads every GPU once.
func (s *Sampler) Sample() []Usage {
	out := make([]Usage, 0, len(s.gpus))
	for _, g := range s.gpus {
		u, err := s.sample(g)
		if err != nil {
			u = Usage{GPU: g, Err: err}
		}
		out = append(out, u)
	}
	return out
}

func (s *Sampler) sample(g GPU) (Usage, error) {
	dev, ret := s.lib.DeviceGetHandleByUUID(g.UUID)
	if ret != nvml.SUCCESS {
		return Usage{}, fmt.Errorf("GPU %d (%s): %s", g.Index, g.UUID, s.lib.ErrorString(ret))
	}
	u := Usage{GPU: g}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Usage{}, fmt.Errorf("GPU %d memory: %s", g.Index, s.lib.ErrorString(ret))
	}
	u.MemoryUsedBytes, u.MemoryTotalBytes = mem.Used, mem.Total
	if rates, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		u.SMPercent = rates.Gpu
	}
	if inMIGMode(dev) {
		instances, procs, err := s.sampleMIG(dev, g)
		if err != nil {
			return Usage{}, err
		}
		u.Instances, u.Processes = instances, procs
		return u, nil
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return Usage{}, fmt.Errorf("GPU %d processes: %s", g.Index, s.lib.ErrorString(ret))
	}
	sm := s.processSM(dev, g.Index)
	for _, p := range procs {
		u.Processes = append(u.Processes, s.process(p, sm[p.Pid]))
	}
	return u, nil
}

// process is a running process as NVML lists it, with its container.
func (s *Sampler) process(p nvml.ProcessInfo, sm float64) Process {
	proc := Process{PID: p.Pid, MemoryBytes: p.UsedGpuMemory, SMPercent: sm}
	if p.UsedGpuMemory == valueNotAvailable {
		proc.MemoryBytes = 0
	}
	cg, err := s.cgroups.Cgroup(p.Pid)
	if err != nil {
		proc.CgroupErr = err
	} else {
		proc.Container, proc.InPod = ContainerOf(cg)
	}
	return proc
}

// valueNotAvailable is NVML_VALUE_NOT_AVAILABLE, which the driver puts in
// a process's used memory where it cannot tell (WDDM, some MIG setups).
const valueNotAvailable = ^uint64(0)

// processSM averages each process's SM samples newer than the last one
// seen. NVML answers ERROR_NOT_FOUND when there is none, and go-nvml
// passes the driver's ERROR_INSUFFICIENT_SIZE on with an empty list; a GPU
// that cannot tell (ERROR_NOT_SUPPORTED) leaves every process at 0.
func (s *Sampler) processSM(dev nvml.Device, gpu int) map[uint32]float64 {
	samples, ret := dev.GetProcessUtilization(s.lastSeen[gpu])
	if ret != nvml.SUCCESS {
		return nil
	}
	sum, n := map[uint32]float64{}, map[uint32]int{}
	for _, x := range samples {
		sum[x.Pid] += float64(x.SmUtil)
		n[x.Pid]++
		s.lastSeen[gpu] = max(s.lastSeen[gpu], x.TimeStamp)
	}
	for pid := range sum {
		sum[pid] /= float64(n[pid])
	}
	return sum
}
