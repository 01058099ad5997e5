package simnode

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
)

// A simulated node runs the processes a file describes, so that what reads
// NVML's process lists and utilization (the per-pod GPU metrics) meets real
// numbers. The file is the node's state, rewritten whole by whoever starts
// and stops the simulated workloads; the node reads it again whenever it
// changes.

// ProcessesFileFormat documents the processes file, for flag help and docs.
const ProcessesFileFormat = `one process per line; blank lines and lines starting with # are skipped:
  GPU[/GI] PID MEMORY_MIB SM_PERCENT [CGROUP]
GPU is the GPU's index, GI (on a GPU in MIG mode) the ID of the GPU instance the process runs in, MEMORY_MIB the memory the process uses on it, SM_PERCENT its share of the GPU's SM time (0-100); a process on several GPUs has a line per GPU. CGROUP, when given, is the process's cgroup as /proc/PID/cgroup would show it (such as 0::/kubepods.slice/…/cri-containerd-ID.scope); without it the process's real /proc/PID/cgroup is read.`

// Process is one simulated process on one GPU.
type Process struct {
	GPU int
	// GPUInstance is the ID of the MIG GPU instance the process runs in;
	// nil on a GPU not in MIG mode.
	GPUInstance *uint32
	PID         uint32
	MemoryMiB   uint64
	SMPercent   uint32
	// Cgroup is the process's /proc/PID/cgroup; empty: the real one.
	Cgroup string
}

// ParseProcesses parses a processes file; errors name the line.
func ParseProcesses(data []byte, name string) ([]Process, error) {
	var out []Process
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, err := parseProcess(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func parseProcess(line string) (Process, error) {
	fields := strings.Fields(line)
	if len(fields) != 4 && len(fields) != 5 {
		return Process{}, fmt.Errorf("want GPU[/GI] PID MEMORY_MIB SM_PERCENT [CGROUP], got %d fields", len(fields))
	}
	gpuField, giField, inMIG := strings.Cut(fields[0], "/")
	gpu, err := strconv.Atoi(gpuField)
	if err != nil || gpu < 0 {
		return Process{}, fmt.Errorf("GPU %q is not an index", gpuField)
	}
	var gi *uint32
	if inMIG {
		id, err := strconv.ParseUint(giField, 10, 32)
		if err != nil || id >= NoInstanceID {
			return Process{}, fmt.Errorf("GPU instance %q is not an instance ID", giField)
		}
		gi = ptr.To(uint32(id))
	}
	pid, err := strconv.ParseUint(fields[1], 10, 32)
	if err != nil || pid == 0 {
		return Process{}, fmt.Errorf("PID %q is not a positive number", fields[1])
	}
	mem, err := strconv.ParseUint(fields[2], 10, 64)
	if err != nil {
		return Process{}, fmt.Errorf("MEMORY_MIB %q is not a number", fields[2])
	}
	sm, err := strconv.ParseUint(fields[3], 10, 32)
	if err != nil || sm > 100 {
		return Process{}, fmt.Errorf("SM_PERCENT %q is not 0-100", fields[3])
	}
	p := Process{GPU: gpu, GPUInstance: gi, PID: uint32(pid), MemoryMiB: mem, SMPercent: uint32(sm)}
	if len(fields) == 5 {
		p.Cgroup = fields[4]
	}
	return p, nil
}

// FormatProcesses writes processes in the file's format.
func FormatProcesses(procs []Process) []byte {
	var b bytes.Buffer
	for _, p := range procs {
		fmt.Fprintf(&b, "%d", p.GPU)
		if p.GPUInstance != nil {
			fmt.Fprintf(&b, "/%d", *p.GPUInstance)
		}
		fmt.Fprintf(&b, " %d %d %d", p.PID, p.MemoryMiB, p.SMPercent)
		if p.Cgroup != "" {
			fmt.Fprintf(&b, " %s", p.Cgroup)
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// processes are the processes the node runs: those of its processes
// file, read again whenever the file changes.
type processes struct {
	states *gpuStates

	mu sync.Mutex
	// file is the processes file; stamp tells its version last read.
	file, stamp string
	list        []Process
	err         error
}

// SetProcessesFile makes the node run the processes the file describes.
// A missing file is a node with no processes; a file that does not parse
// keeps the processes read before, and the error is the node's next answer
// to ProcessesError.
func (p *processes) SetProcessesFile(path string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.file = path
	p.stamp = ""
}

// ProcessesError is the last error reading the processes file, if any.
func (p *processes) ProcessesError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readLocked()
	return p.err
}

// readLocked reads the processes file again when it changed.
func (p *processes) readLocked() {
	if p.file == "" {
		return
	}
	st, err := os.Stat(p.file)
	if errors.Is(err, os.ErrNotExist) {
		p.list, p.err, p.stamp = nil, nil, ""
		return
	}
	if err != nil {
		p.err = fmt.Errorf("simulated processes: %w", err)
		return
	}
	// The inode too: a file replaced by rename within one clock tick
	// keeps its time and may keep its size.
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	stamp := fmt.Sprint(st.ModTime().UnixNano(), st.Size(), ino)
	if stamp == p.stamp {
		return
	}
	data, err := os.ReadFile(p.file)
	if err != nil {
		p.err = fmt.Errorf("simulated processes: %w", err)
		return
	}
	procs, err := ParseProcesses(data, p.file)
	if err != nil {
		p.err = err
		return
	}
	p.list, p.err, p.stamp = procs, nil, stamp
}

func (p *processes) processesOn(gpu int) []Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readLocked()
	var out []Process
	for _, proc := range p.list {
		if proc.GPU == gpu {
			out = append(out, proc)
		}
	}
	return out
}

// Cgroups reads processes' cgroups on the simulated node: a process the
// file gives a cgroup for has that one; any other is read by real (a test
// that runs real processes on simulated GPUs).
func (p *processes) Cgroups(real gpuusage.CgroupReader) gpuusage.CgroupReader {
	return simulatedCgroups{procs: p, real: real}
}

type simulatedCgroups struct {
	procs *processes
	real  gpuusage.CgroupReader
}

func (s simulatedCgroups) Cgroup(pid uint32) (string, error) {
	if cg, ok := s.procs.cgroup(pid); ok {
		return cg, nil
	}
	return s.real.Cgroup(pid)
}

// cgroup is the simulated /proc/PID/cgroup of a process the file gives
// one for; ok is false for any other PID.
func (p *processes) cgroup(pid uint32) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readLocked()
	for _, proc := range p.list {
		if proc.PID == pid && proc.Cgroup != "" {
			return proc.Cgroup, true
		}
	}
	return "", false
}

// runningProcesses answers nvmlDeviceGetComputeRunningProcesses.
func (p *processes) runningProcesses(gpu int) ([]nvml.ProcessInfo, nvml.Return) {
	if ret := p.states.failure(gpu); ret != nvml.SUCCESS {
		return nil, ret
	}
	var out []nvml.ProcessInfo
	for _, proc := range p.processesOn(gpu) {
		info := nvml.ProcessInfo{Pid: proc.PID, UsedGpuMemory: proc.MemoryMiB << 20, GpuInstanceId: NoInstanceID, ComputeInstanceId: NoInstanceID}
		if proc.GPUInstance != nil {
			info.GpuInstanceId = *proc.GPUInstance
		}
		out = append(out, info)
	}
	return out, nvml.SUCCESS
}

// instanceProcesses are the processes of a MIG GPU instance, as its MIG
// device's nvmlDeviceGetComputeRunningProcesses lists them: those the
// file puts in the GPU instance, every one in the compute instance ci.
func (p *processes) instanceProcesses(gpu, gi, ci int) []nvml.ProcessInfo {
	var out []nvml.ProcessInfo
	for _, proc := range p.processesOn(gpu) {
		if proc.GPUInstance != nil && int(*proc.GPUInstance) == gi {
			out = append(out, nvml.ProcessInfo{Pid: proc.PID, UsedGpuMemory: proc.MemoryMiB << 20, GpuInstanceId: uint32(gi), ComputeInstanceId: uint32(ci)})
		}
	}
	return out
}

// processUtilization answers nvmlDeviceGetProcessUtilization as the driver
// does: one sample per running process newer than lastSeen (timestamps in
// microseconds), and ERROR_NOT_FOUND when there is none.
func (p *processes) processUtilization(gpu int, lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	if ret := p.states.failure(gpu); ret != nvml.SUCCESS {
		return nil, ret
	}
	now := uint64(time.Now().UnixMicro())
	var out []nvml.ProcessUtilizationSample
	for _, proc := range p.processesOn(gpu) {
		if now > lastSeen {
			out = append(out, nvml.ProcessUtilizationSample{Pid: proc.PID, TimeStamp: now, SmUtil: proc.SMPercent})
		}
	}
	if len(out) == 0 {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return out, nvml.SUCCESS
}

// utilization answers nvmlDeviceGetUtilizationRates: the processes' SM
// shares added up, at most 100.
func (p *processes) utilization(gpu int) (nvml.Utilization, nvml.Return) {
	if ret := p.states.failure(gpu); ret != nvml.SUCCESS {
		return nvml.Utilization{}, ret
	}
	var sum uint32
	for _, proc := range p.processesOn(gpu) {
		sum += proc.SMPercent
	}
	return nvml.Utilization{Gpu: min(sum, 100)}, nvml.SUCCESS
}

// memoryUsedMiB is the memory the GPU's processes use.
func (p *processes) memoryUsedMiB(gpu int) uint64 {
	var sum uint64
	for _, proc := range p.processesOn(gpu) {
		sum += proc.MemoryMiB
	}
	return sum
}
