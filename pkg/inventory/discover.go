package inventory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// PCIeTopology answers what NVML does not report itself: the PCIe root
// complex a GPU sits under, and its NUMA node where NVML cannot tell.
// Real nodes read sysfs (SysfsPCIe); a simulated node answers from its
// description.
type PCIeTopology interface {
	PCIeRoot(busID string) (string, error)
	NUMANode(busID string) (int, error)
}

// Discover queries NVML for every GPU and every pair's link. lib must be
// initialised (nvml.Interface.Init) by the caller, who owns the NVML session.
func Discover(ctx context.Context, lib nvml.Interface, pcie PCIeTopology) (*Inventory, error) {
	logger := klog.FromContext(ctx)
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count GPUs: %w", nvmlError(lib, ret))
	}
	inv := &Inventory{}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		inv.DriverVersion = v
	} else {
		return nil, fmt.Errorf("read driver version: %w", nvmlError(lib, ret))
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		inv.CUDADriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}

	devices := make([]nvml.Device, count)
	for i := 0; i < count; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: get handle: %w", i, nvmlError(lib, ret))
		}
		devices[i] = dev
		gpu, err := describe(lib, dev, i, pcie)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		inv.GPUs = append(inv.GPUs, gpu)
	}

	links, warnings, err := discoverLinks(lib, devices, inv.GPUs)
	if err != nil {
		return nil, err
	}
	inv.Links = links
	inv.Warnings = append(inv.Warnings, warnings...)
	for _, w := range inv.Warnings {
		logger.Info("GPU inventory", "warning", w)
	}
	for _, g := range inv.GPUs {
		// Said where it matters, when a MIG profile is given the GPU (the
		// plan's warnings, a Node event, the doctor): a node that uses no
		// MIG, or a plugin without the permission to read placements, is
		// no fault.
		if g.MIGCapable && g.MIG == nil {
			logger.V(2).Info("NVML gives no MIG geometry for a GPU that has MIG", "gpu", g.Index, "reason", g.NoMIG)
		}
	}
	logger.V(2).Info("Discovered GPUs", "gpus", len(inv.GPUs), "summary", inv.Summary())
	return inv, nil
}

func describe(lib nvml.Interface, dev nvml.Device, index int, pcie PCIeTopology) (GPU, error) {
	g := GPU{Index: index, NUMANode: -1}
	var ret nvml.Return
	if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("read UUID: %w", nvmlError(lib, ret))
	}
	if g.Minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("read minor number: %w", nvmlError(lib, ret))
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("read PCI info: %w", nvmlError(lib, ret))
	}
	busID, err := NormalizeBusID(cString(pci.BusId[:]))
	if err != nil {
		return g, fmt.Errorf("read PCI info: %w", err)
	}
	g.PCIBusID = busID
	if g.ProductName, ret = dev.GetName(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("read product name: %w", nvmlError(lib, ret))
	}
	if arch, ret := dev.GetArchitecture(); ret == nvml.SUCCESS {
		g.Architecture = ArchitectureName(arch)
	} else {
		g.Architecture = "unknown"
	}
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("read CUDA compute capability: %w", nvmlError(lib, ret))
	}
	g.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("read memory size: %w", nvmlError(lib, ret))
	}
	g.MemoryMiB = int64(mem.Total / (1 << 20))
	readMIG(dev, &g, mem.Total)

	// NVML knows the NUMA node on recent drivers only; sysfs always does.
	if n, ret := dev.GetNumaNodeId(); ret == nvml.SUCCESS {
		g.NUMANode = n
	} else if pcie != nil {
		if n, err := pcie.NUMANode(g.PCIBusID); err == nil {
			g.NUMANode = n
		}
	}
	if pcie != nil {
		if root, err := pcie.PCIeRoot(g.PCIBusID); err == nil {
			g.PCIeRoot = root
		}
	}
	return g, nil
}

// readMIG reads the GPU's MIG geometry, or why it has none: a GPU NVML
// gives no geometry for is a fact of the node, as one without MIG is,
// never a failed discovery.
func readMIG(dev nvml.Device, g *GPU, memoryBytes uint64) {
	m, err := mig.Read(dev, g.ProductName, memoryBytes)
	if err != nil {
		g.NoMIG = err.Error()
		g.MIGCapable = !errors.Is(err, mig.ErrNotCapable)
		return
	}
	g.MIG, g.MIGCapable = &m, true
}

// discoverLinks fills the link matrix: PCIe common ancestors from NVML,
// and NVLinks by following every active link to the GPU (or NVSwitch) at
// its other end.
func discoverLinks(lib nvml.Interface, devices []nvml.Device, gpus []GPU) ([][]Link, []string, error) {
	n := len(devices)
	byBusID := map[string]int{}
	for i, g := range gpus {
		byBusID[g.PCIBusID] = i
	}
	direct := make([][]int, n)
	switchLinks := make([]int, n)
	for i, dev := range devices {
		direct[i] = make([]int, n)
		for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
			state, ret := dev.GetNvLinkState(link)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				break // no (more) NVLink ports on this GPU
			}
			if ret != nvml.SUCCESS {
				return nil, nil, fmt.Errorf("GPU %d: read NVLink %d state: %w", i, link, nvmlError(lib, ret))
			}
			if state != nvml.FEATURE_ENABLED {
				continue
			}
			if kind, ret := dev.GetNvLinkRemoteDeviceType(link); ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH {
				switchLinks[i]++
				continue
			}
			remote, ret := dev.GetNvLinkRemotePciInfo(link)
			if ret != nvml.SUCCESS {
				return nil, nil, fmt.Errorf("GPU %d: read NVLink %d peer: %w", i, link, nvmlError(lib, ret))
			}
			peerBus, err := NormalizeBusID(cString(remote.BusId[:]))
			if err != nil {
				continue
			}
			if peer, ok := byBusID[peerBus]; ok && peer != i {
				direct[i][peer]++
			}
		}
	}

	var warnings []string
	links := make([][]Link, n)
	for i := range links {
		links[i] = make([]Link, n)
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			level, ret := devices[i].GetTopologyCommonAncestor(devices[j])
			if ret != nvml.SUCCESS {
				return nil, nil, fmt.Errorf("GPUs %d and %d: read PCIe common ancestor: %w", i, j, nvmlError(lib, ret))
			}
			nv := direct[i][j]
			if direct[j][i] != nv {
				// Never trust one side only: count what both agree on.
				nv = min(direct[i][j], direct[j][i])
				warnings = append(warnings, fmt.Sprintf("GPU %d reports %d NVLinks to GPU %d, which reports %d back; counting %d", i, direct[i][j], j, direct[j][i], nv))
			}
			if switchLinks[i] > 0 && switchLinks[j] > 0 {
				nv += min(switchLinks[i], switchLinks[j])
			}
			l := Link{NVLinks: nv, PCIe: pcieLevel(level)}
			links[i][j], links[j][i] = l, l
		}
	}
	return links, warnings, nil
}

func pcieLevel(l nvml.GpuTopologyLevel) PCIeLevel {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return PCIeSameBoard
	case nvml.TOPOLOGY_SINGLE:
		return PCIeSingleSwitch
	case nvml.TOPOLOGY_MULTIPLE:
		return PCIeMultiSwitch
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return PCIeHostBridge
	case nvml.TOPOLOGY_NODE:
		return PCIeNUMANode
	default:
		return PCIeSystem
	}
}

// ComputeModeName names a compute mode as nvidia-smi does.
func ComputeModeName(m nvml.ComputeMode) string {
	switch m {
	case nvml.COMPUTEMODE_DEFAULT:
		return "Default"
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return "Exclusive_Thread"
	case nvml.COMPUTEMODE_PROHIBITED:
		return "Prohibited"
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "Exclusive_Process"
	}
	return fmt.Sprintf("ComputeMode(%d)", int(m))
}

// ArchitectureName turns NVML's architecture code into a lower-case name.
func ArchitectureName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "volta"
	case nvml.DEVICE_ARCH_TURING:
		return "turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "blackwell"
	default:
		return "unknown"
	}
}

// ArchitectureCode is the inverse of ArchitectureName.
func ArchitectureCode(name string) nvml.DeviceArchitecture {
	for a := nvml.DeviceArchitecture(nvml.DEVICE_ARCH_KEPLER); a <= nvml.DEVICE_ARCH_BLACKWELL; a++ {
		if ArchitectureName(a) == name {
			return a
		}
	}
	return nvml.DEVICE_ARCH_UNKNOWN
}

// NormalizeBusID turns NVML's "00000000:18:00.0" into the kernel's
// "0000:18:00.0" (lower case, 4-digit domain), the form sysfs and the
// Kubernetes PCI attributes use.
func NormalizeBusID(id string) (string, error) {
	id = strings.ToLower(strings.TrimSpace(id))
	parts := strings.SplitN(id, ":", 2)
	if len(parts) != 2 || len(parts[1]) != 7 {
		return "", fmt.Errorf("malformed PCI bus ID %q", id)
	}
	domain, err := strconv.ParseUint(parts[0], 16, 32)
	if err != nil {
		return "", fmt.Errorf("malformed PCI bus ID %q: %w", id, err)
	}
	return fmt.Sprintf("%04x:%s", domain, parts[1]), nil
}

func cString(b []uint8) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func nvmlError(lib nvml.Interface, ret nvml.Return) error {
	return fmt.Errorf("NVML: %s (%d)", lib.ErrorString(ret), int(ret))
}

// ErrNoGPUs is returned where a node must have GPUs and has none.
var ErrNoGPUs = errors.New("no NVIDIA GPUs found")
