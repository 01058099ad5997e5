package nvmlconformance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// valueNotAvailable is NVML_VALUE_NOT_AVAILABLE, which a process's used
// memory may be where the driver cannot tell; pkg/gpuusage counts it as 0.
const valueNotAvailable = ^uint64(0)

// processes asks what pkg/gpuusage's sampler asks a GPU: its utilization
// (any answer: a GPU that cannot tell is sampled at 0), its running
// processes (the sampler reports a GPU whose list fails as unreadable),
// and each process's SM samples since a time (ERROR_NOT_FOUND when there
// are none; a GPU that cannot tell leaves every process at 0). In MIG
// mode the sampler reads the processes of the MIG devices instead
// (mig-devices).
func (s *suite) processes(g *gpu) Result {
	var p problems
	util := "GetUtilizationRates "
	switch u, ret := g.dev.GetUtilizationRates(); {
	case ret == nvml.SUCCESS && (u.Gpu > 100 || u.Memory > 100):
		p.add("GetUtilizationRates answers %d%% SM, %d%% memory", u.Gpu, u.Memory)
	case ret == nvml.SUCCESS:
		util += fmt.Sprintf("%d%% SM", u.Gpu)
	default:
		util += s.errorString(ret)
	}
	if g.migOn {
		return p.result(CheckProcesses, g.index, util+"; MIG mode on: the sampler reads the processes of the MIG devices (mig-devices)")
	}
	procs, ret := g.dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		p.add("GetComputeRunningProcesses: %s", s.errorString(ret))
		return p.result(CheckProcesses, g.index, "")
	}
	p = append(p, wellFormed("GetComputeRunningProcesses", procs, g.memoryBytes)...)
	samples := "GetProcessUtilization "
	switch got, ret := g.dev.GetProcessUtilization(0); ret {
	case nvml.SUCCESS:
		for _, x := range got {
			if x.Pid == 0 || x.SmUtil > 100 {
				p.add("GetProcessUtilization answers PID %d at %d%% SM", x.Pid, x.SmUtil)
			}
		}
		samples += fmt.Sprintf("%d samples", len(got))
	default:
		samples += s.errorString(ret)
	}
	return p.result(CheckProcesses, g.index, fmt.Sprintf("%s; %d running processes%s; %s", util, len(procs), pidList(procs), samples))
}

// wellFormed checks a process list: real PIDs, each once, each with at
// most the GPU's memory (or NVML's "not available").
func wellFormed(call string, procs []nvml.ProcessInfo, memoryBytes uint64) problems {
	var p problems
	var seen []uint32
	for _, x := range procs {
		switch {
		case x.Pid == 0:
			p.add("%s lists PID 0", call)
		case slices.Contains(seen, x.Pid):
			p.add("%s lists PID %d twice", call, x.Pid)
		case x.UsedGpuMemory != valueNotAvailable && memoryBytes > 0 && x.UsedGpuMemory > memoryBytes:
			p.add("%s: PID %d uses %d bytes of %d", call, x.Pid, x.UsedGpuMemory, memoryBytes)
		}
		seen = append(seen, x.Pid)
	}
	return p
}

func pidList(procs []nvml.ProcessInfo) string {
	if len(procs) == 0 {
		return ""
	}
	var out []string
	for _, x := range procs {
		out = append(out, fmt.Sprintf("%d (%d MiB)", x.Pid, x.UsedGpuMemory>>20))
	}
	return " (" + strings.Join(out, ", ") + ")"
}

// migDevices reads a MIG-mode GPU's MIG devices as pkg/gpuusage and
// pkg/miginstance do: the slots GetMaxMigDeviceCount gives, each a device
// or ERROR_NOT_FOUND; each device's UUID (MIG-…, by which NVML finds it
// again), its parent (the health monitor takes its events for the GPU's),
// its GPU instance (whose profile and placement are the GPU's), its
// compute instance, its name (ending in the profile's name as the plugin
// derives it), its memory and its processes.
func (s *suite) migDevices(g *gpu) Result {
	if !g.migOn {
		return Result{Check: CheckMIGDevices, GPU: g.index, Status: Skip, Message: "MIG mode off: the GPU has no MIG device"}
	}
	var p problems
	n, ret := g.dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		p.add("GetMaxMigDeviceCount: %s", s.errorString(ret))
		return p.result(CheckMIGDevices, g.index, "")
	}
	var found []string
	for i := range n {
		md, ret := g.dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			p.add("GetMigDeviceHandleByIndex(%d): %s", i, s.errorString(ret))
			continue
		}
		line, dp := s.migDevice(g, i, md)
		p = append(p, dp...)
		if line != "" {
			found = append(found, line)
		}
	}
	return p.result(CheckMIGDevices, g.index, fmt.Sprintf("%d MIG device slots, %d devices: %s", n, len(found), strings.Join(found, ", ")))
}

// migDevice checks the MIG device in slot i.
func (s *suite) migDevice(g *gpu, i int, md nvml.Device) (string, problems) {
	var p problems
	what := fmt.Sprintf("MIG device %d", i)
	uuid, ret := md.GetUUID()
	if ret != nvml.SUCCESS || !strings.HasPrefix(uuid, "MIG-") {
		p.add("%s: GetUUID answers %q (%s)", what, uuid, s.errorString(ret))
		return "", p
	}
	what += " (" + uuid + ")"
	if _, ret := s.t.NVML.DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS {
		p.add("%s: DeviceGetHandleByUUID: %s", what, s.errorString(ret))
	}
	if parent, ret := md.GetDeviceHandleFromMigDeviceHandle(); ret != nvml.SUCCESS {
		p.add("%s: GetDeviceHandleFromMigDeviceHandle: %s", what, s.errorString(ret))
	} else if pu, ret := parent.GetUUID(); ret != nvml.SUCCESS || !strings.EqualFold(pu, g.uuid) {
		p.add("%s: its parent answers UUID %q (%s), not %s", what, pu, s.errorString(ret), g.uuid)
	}
	if _, ret := md.GetComputeInstanceId(); ret != nvml.SUCCESS {
		p.add("%s: GetComputeInstanceId: %s", what, s.errorString(ret))
	}
	profile := ""
	if giID, ret := md.GetGpuInstanceId(); ret != nvml.SUCCESS {
		p.add("%s: GetGpuInstanceId: %s", what, s.errorString(ret))
	} else if gi, ret := g.dev.GetGpuInstanceById(giID); ret != nvml.SUCCESS {
		p.add("%s: GetGpuInstanceById(%d): %s", what, giID, s.errorString(ret))
	} else if info, ret := gi.GetInfo(); ret != nvml.SUCCESS {
		p.add("%s: GPU instance %d: GetInfo: %s", what, giID, s.errorString(ret))
	} else if pr, err := g.geometry.model.ProfileByID(int(info.ProfileId)); err != nil {
		p.add("%s: GPU instance %d: %v", what, giID, err)
	} else {
		profile = pr.Name
		at := mig.Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}
		if !slices.Contains(pr.Placements, at) {
			p.add("%s: GPU instance %d of %s sits at %s, not one of %s", what, giID, pr.Name, at, placementsString(pr.Placements))
		}
	}
	if name, ret := md.GetName(); ret != nvml.SUCCESS {
		p.add("%s: GetName: %s", what, s.errorString(ret))
	} else if profile != "" && !namesProfile(name, profile) {
		p.add("%s: named %q, which does not end in MIG %s, the name the plugin derives for its profile", what, name, profile)
	}
	mem, ret := md.GetMemoryInfo()
	switch {
	case ret != nvml.SUCCESS:
		p.add("%s: GetMemoryInfo: %s", what, s.errorString(ret))
	case mem.Total == 0 || mem.Used > mem.Total || mem.Total > g.memoryBytes:
		p.add("%s: GetMemoryInfo answers %d bytes used of %d, on a GPU of %d", what, mem.Used, mem.Total, g.memoryBytes)
	}
	procs, ret := md.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		p.add("%s: GetComputeRunningProcesses: %s", what, s.errorString(ret))
	} else {
		p = append(p, wellFormed(what+": GetComputeRunningProcesses", procs, mem.Total)...)
	}
	return fmt.Sprintf("%s %s, %d processes", uuid, profile, len(procs)), p
}

// namesProfile says whether a MIG device's name ends in its profile's
// name: "NVIDIA H200 MIG 1g.18gb", or "… MIG 1c.2g.35gb" for a compute
// instance smaller than its GPU instance.
func namesProfile(name, profile string) bool {
	i := strings.LastIndex(name, "MIG ")
	if i < 0 {
		return false
	}
	tail := name[i+len("MIG "):]
	if tail == profile {
		return true
	}
	c, rest, ok := strings.Cut(tail, "c.")
	return ok && rest == profile && c != "" && strings.Trim(c, "0123456789") == ""
}
