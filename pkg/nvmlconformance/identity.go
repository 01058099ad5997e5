package nvmlconformance

import (
	"context"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// discovery is the plugin's own discovery (pkg/inventory), which every
// other piece of the plugin starts from; it returns the GPU count NVML
// gives, false when there is nothing to check.
func (s *suite) discovery(ctx context.Context) (int, bool) {
	lib := s.t.NVML
	var p problems
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		s.add(Result{Check: CheckDiscovery, GPU: NodeWide, Status: Fail, Message: "DeviceGetCount: " + s.errorString(ret)})
		return 0, false
	}
	if n < 1 {
		p.add("DeviceGetCount answers %d GPUs", n)
	}
	if v, ret := lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		p.add("SystemGetDriverVersion: %s", s.errorString(ret))
	} else if !strings.Contains(v, ".") {
		p.add("SystemGetDriverVersion answers %q, not a version", v)
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && v < 1000 {
		p.add("SystemGetCudaDriverVersion answers %d, not major*1000+minor*10", v)
	}
	inv, err := inventory.Discover(ctx, lib, s.t.PCIe)
	if err != nil {
		p.add("the plugin's discovery fails: %v", err)
		s.add(p.result(CheckDiscovery, NodeWide, ""))
		return n, true
	}
	found := fmt.Sprintf("%s, CUDA %s", inv.Summary(), inv.CUDADriverVersion)
	if len(inv.Warnings) > 0 {
		found += "; warnings: " + strings.Join(inv.Warnings, "; ")
	}
	if len(inv.GPUs) != n {
		p.add("the plugin discovers %d GPUs, DeviceGetCount answers %d", len(inv.GPUs), n)
	}
	s.add(p.result(CheckDiscovery, NodeWide, found))
	return n, true
}

// identity asks GPU i what discovery and the health monitor's probes ask,
// and checks the answers agree: its handle by index and by UUID are the
// same GPU, its UUID is GPU-…, its bus ID one the plugin can read, its
// minor one /dev/nvidia<minor> can have. nil when NVML gives no handle.
func (s *suite) identity(i int) (*gpu, Result) {
	lib := s.t.NVML
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, Result{Check: CheckIdentity, GPU: i, Status: Fail, Message: "DeviceGetHandleByIndex: " + s.errorString(ret)}
	}
	g := &gpu{index: i, dev: dev, minor: -1}
	var p problems
	if idx, ret := dev.GetIndex(); ret != nvml.SUCCESS || idx != i {
		p.add("GetIndex answers %d (%s) for the handle of index %d", idx, s.errorString(ret), i)
	}
	var uuid string
	if uuid, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		p.add("GetUUID: %s", s.errorString(ret))
	} else if !strings.HasPrefix(uuid, "GPU-") || len(uuid) < len("GPU-")+8 {
		p.add("UUID %q is not GPU-<uuid>", uuid)
	} else {
		g.uuid = uuid
		// The health monitor and the usage sampler take GPUs by UUID.
		switch byUUID, ret := lib.DeviceGetHandleByUUID(uuid); {
		case ret != nvml.SUCCESS:
			p.add("DeviceGetHandleByUUID(%s): %s", uuid, s.errorString(ret))
		default:
			if idx, ret := byUUID.GetIndex(); ret != nvml.SUCCESS || idx != i {
				p.add("the handle of UUID %s answers index %d (%s), not %d", uuid, idx, s.errorString(ret), i)
			}
		}
	}
	if minor, ret := dev.GetMinorNumber(); ret != nvml.SUCCESS {
		p.add("GetMinorNumber: %s", s.errorString(ret))
	} else if minor < 0 || minor > 254 {
		// 255 is nvidiactl's.
		p.add("minor number %d is not one of /dev/nvidia0 to /dev/nvidia254", minor)
	} else {
		g.minor = minor
	}
	if pci, ret := dev.GetPciInfo(); ret != nvml.SUCCESS {
		p.add("GetPciInfo: %s", s.errorString(ret))
	} else if bus, err := inventory.NormalizeBusID(cString(pci.BusId[:])); err != nil {
		p.add("GetPciInfo: %v", err)
	} else {
		g.busID = bus
	}
	if g.name, ret = dev.GetName(); ret != nvml.SUCCESS || strings.TrimSpace(g.name) == "" {
		p.add("GetName answers %q (%s)", g.name, s.errorString(ret))
	}
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS || major < 1 {
		p.add("GetCudaComputeCapability answers %d.%d (%s)", major, minor, s.errorString(ret))
	}
	arch := "unknown"
	if a, ret := dev.GetArchitecture(); ret == nvml.SUCCESS {
		arch = inventory.ArchitectureName(a)
	}
	mem, ret := dev.GetMemoryInfo()
	switch {
	case ret != nvml.SUCCESS:
		p.add("GetMemoryInfo: %s", s.errorString(ret))
	case mem.Total == 0 || mem.Used > mem.Total:
		p.add("GetMemoryInfo answers %d bytes used of %d", mem.Used, mem.Total)
	default:
		g.memoryBytes = mem.Total
	}
	// Either answer is taken: discovery reads the NUMA node from sysfs
	// where NVML cannot tell (a VM's GPU answers Not Supported).
	numa := "NUMA node: GetNumaNodeId "
	if n, ret := dev.GetNumaNodeId(); ret == nvml.SUCCESS {
		numa += fmt.Sprint(n)
	} else {
		numa += s.errorString(ret)
	}
	return g, p.result(CheckIdentity, i, fmt.Sprintf("%s, %s, bus %s, minor %d, %d MiB, %s %d.%d, %s",
		g.uuid, g.name, g.busID, g.minor, g.memoryBytes>>20, arch, major, minor, numa))
}

// distinct checks what tells GPUs apart: no two share a UUID (the key of
// every checkpoint and CDI device), a bus ID or a minor number.
func (s *suite) distinct(n int) Result {
	var p problems
	if len(s.gpus) != n {
		p.add("%d of %d GPUs give no handle", n-len(s.gpus), n)
	}
	uuids, buses, minors := map[string]int{}, map[string]int{}, map[int]int{}
	for _, g := range s.gpus {
		if j, dup := uuids[strings.ToLower(g.uuid)]; dup && g.uuid != "" {
			p.add("GPUs %d and %d have UUID %s", j, g.index, g.uuid)
		}
		uuids[strings.ToLower(g.uuid)] = g.index
		if j, dup := buses[g.busID]; dup && g.busID != "" {
			p.add("GPUs %d and %d sit at bus %s", j, g.index, g.busID)
		}
		buses[g.busID] = g.index
		if j, dup := minors[g.minor]; dup && g.minor >= 0 {
			p.add("GPUs %d and %d have minor number %d", j, g.index, g.minor)
		}
		minors[g.minor] = g.index
	}
	return p.result(CheckDistinctGPUs, NodeWide, fmt.Sprintf("%d GPUs, each with its own UUID, bus ID and minor number", len(s.gpus)))
}

// modes reads the compute mode (the MPS path sets and restores it,
// gpu-check compares it before and after) and the persistence mode.
func (s *suite) modes(g *gpu) Result {
	var p problems
	mode, ret := g.dev.GetComputeMode()
	switch {
	case ret != nvml.SUCCESS:
		p.add("GetComputeMode: %s", s.errorString(ret))
	case mode != nvml.COMPUTEMODE_DEFAULT && mode != nvml.COMPUTEMODE_EXCLUSIVE_THREAD &&
		mode != nvml.COMPUTEMODE_PROHIBITED && mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		p.add("GetComputeMode answers %d, not a compute mode", mode)
	}
	persistence := "persistence mode Not Supported"
	switch pm, ret := g.dev.GetPersistenceMode(); {
	case ret == nvml.SUCCESS && (pm == nvml.FEATURE_ENABLED || pm == nvml.FEATURE_DISABLED):
		persistence = fmt.Sprintf("persistence mode %s", enabled(pm == nvml.FEATURE_ENABLED))
	case ret == nvml.SUCCESS:
		p.add("GetPersistenceMode answers %d", pm)
	case ret != nvml.ERROR_NOT_SUPPORTED:
		p.add("GetPersistenceMode: %s", s.errorString(ret))
	}
	return p.result(CheckModes, g.index, fmt.Sprintf("compute mode %s, %s", inventory.ComputeModeName(mode), persistence))
}

func enabled(on bool) string {
	if on {
		return "Enabled"
	}
	return "Disabled"
}

func cString(b []uint8) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
