package simnode

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
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

// SetProcessesFile makes the node run the processes the file describes.
// A missing file is a node with no processes; a file that does not parse
// keeps the processes read before, and the error is the node's next answer
// to ProcessesError.
func (n *Node) SetProcessesFile(path string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.procFile = path
	n.procStamp = ""
}

// ProcessesError is the last error reading the processes file, if any.
func (n *Node) ProcessesError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.readProcessesLocked()
	return n.procErr
}

// readProcessesLocked reads the processes file again when it changed.
func (n *Node) readProcessesLocked() {
	if n.procFile == "" {
		return
	}
	st, err := os.Stat(n.procFile)
	if errors.Is(err, os.ErrNotExist) {
		n.procs, n.procErr, n.procStamp = nil, nil, ""
		return
	}
	if err != nil {
		n.procErr = fmt.Errorf("simulated processes: %w", err)
		return
	}
	// The inode too: a file replaced by rename within one clock tick
	// keeps its time and may keep its size.
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	stamp := fmt.Sprint(st.ModTime().UnixNano(), st.Size(), ino)
	if stamp == n.procStamp {
		return
	}
	data, err := os.ReadFile(n.procFile)
	if err != nil {
		n.procErr = fmt.Errorf("simulated processes: %w", err)
		return
	}
	procs, err := ParseProcesses(data, n.procFile)
	if err != nil {
		n.procErr = err
		return
	}
	n.procs, n.procErr, n.procStamp = procs, nil, stamp
}

func (n *Node) processesOn(gpu int) []Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.readProcessesLocked()
	var out []Process
	for _, p := range n.procs {
		if p.GPU == gpu {
			out = append(out, p)
		}
	}
	return out
}

// Cgroups reads processes' cgroups on the simulated node: a process the
// file gives a cgroup for has that one; any other is read by real (a test
// that runs real processes on simulated GPUs).
func (n *Node) Cgroups(real gpuusage.CgroupReader) gpuusage.CgroupReader {
	return simulatedCgroups{n: n, real: real}
}

type simulatedCgroups struct {
	n    *Node
	real gpuusage.CgroupReader
}

func (s simulatedCgroups) Cgroup(pid uint32) (string, error) {
	if cg, ok := s.n.processCgroup(pid); ok {
		return cg, nil
	}
	return s.real.Cgroup(pid)
}

// processCgroup is the simulated /proc/PID/cgroup of a process the file
// gives one for; ok is false for any other PID.
func (n *Node) processCgroup(pid uint32) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.readProcessesLocked()
	for _, p := range n.procs {
		if p.PID == pid && p.Cgroup != "" {
			return p.Cgroup, true
		}
	}
	return "", false
}

// runningProcesses answers nvmlDeviceGetComputeRunningProcesses.
func (n *Node) runningProcesses(gpu int) ([]nvml.ProcessInfo, nvml.Return) {
	if ret := n.failure(gpu); ret != nvml.SUCCESS {
		return nil, ret
	}
	var out []nvml.ProcessInfo
	for _, p := range n.processesOn(gpu) {
		info := nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.MemoryMiB << 20, GpuInstanceId: NoInstanceID, ComputeInstanceId: NoInstanceID}
		if p.GPUInstance != nil {
			info.GpuInstanceId = *p.GPUInstance
		}
		out = append(out, info)
	}
	return out, nvml.SUCCESS
}

// instanceProcesses are the processes of a MIG GPU instance, as its MIG
// device's nvmlDeviceGetComputeRunningProcesses lists them: those the
// file puts in the GPU instance, every one in the compute instance ci.
func (n *Node) instanceProcesses(gpu, gi, ci int) []nvml.ProcessInfo {
	var out []nvml.ProcessInfo
	for _, p := range n.processesOn(gpu) {
		if p.GPUInstance != nil && int(*p.GPUInstance) == gi {
			out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.MemoryMiB << 20, GpuInstanceId: uint32(gi), ComputeInstanceId: uint32(ci)})
		}
	}
	return out
}

// processUtilization answers nvmlDeviceGetProcessUtilization as the driver
// does: one sample per running process newer than lastSeen (timestamps in
// microseconds), and ERROR_NOT_FOUND when there is none.
func (n *Node) processUtilization(gpu int, lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	if ret := n.failure(gpu); ret != nvml.SUCCESS {
		return nil, ret
	}
	now := uint64(time.Now().UnixMicro())
	var out []nvml.ProcessUtilizationSample
	for _, p := range n.processesOn(gpu) {
		if now > lastSeen {
			out = append(out, nvml.ProcessUtilizationSample{Pid: p.PID, TimeStamp: now, SmUtil: p.SMPercent})
		}
	}
	if len(out) == 0 {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return out, nvml.SUCCESS
}

// utilization answers nvmlDeviceGetUtilizationRates: the processes' SM
// shares added up, at most 100.
func (n *Node) utilization(gpu int) (nvml.Utilization, nvml.Return) {
	if ret := n.failure(gpu); ret != nvml.SUCCESS {
		return nvml.Utilization{}, ret
	}
	var sum uint32
	for _, p := range n.processesOn(gpu) {
		sum += p.SMPercent
	}
	return nvml.Utilization{Gpu: min(sum, 100)}, nvml.SUCCESS
}

// memoryUsedMiB is the memory the GPU's processes use.
func (n *Node) memoryUsedMiB(gpu int) uint64 {
	var sum uint64
	for _, p := range n.processesOn(gpu) {
		sum += p.MemoryMiB
	}
	return sum
}
