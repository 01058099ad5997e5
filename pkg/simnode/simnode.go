// Package simnode serves a simulated GPU node through go-nvml's Interface,
// built on go-nvml's own mock types. The driver's discovery, planning and
// health code runs on it exactly as on real hardware; only the answers come
// from a NodeTopology description (a built-in preset or a user's file)
// instead of the kernel driver.
package simnode

import (
	"crypto/sha256"
	"embed"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

//go:embed presets/*.yaml
var presetFiles embed.FS

// NVIDIADeviceMajor is the fixed character-device major of /dev/nvidia*.
const NVIDIADeviceMajor = 195

// Presets lists the built-in simulated nodes.
func Presets() []string {
	entries, err := presetFiles.ReadDir("presets")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	slices.Sort(names)
	return names
}

// PresetSource returns the YAML of a built-in preset.
func PresetSource(name string) ([]byte, error) {
	b, err := presetFiles.ReadFile(path.Join("presets", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("unknown preset %q; presets are %s, or give the path of a NodeTopology file", name, strings.Join(Presets(), ", "))
	}
	return b, nil
}

// LoadTopology reads a preset by name, or a NodeTopology file when spec is
// not a preset name (a path, with a '/' or a .yaml/.json ending).
func LoadTopology(spec string) (*v1alpha1.NodeTopology, error) {
	if slices.Contains(Presets(), spec) {
		data, err := PresetSource(spec)
		if err != nil {
			return nil, err
		}
		return v1alpha1.LoadNodeTopology(data, "preset "+spec)
	}
	if !strings.ContainsRune(spec, '/') && !strings.HasSuffix(spec, ".yaml") && !strings.HasSuffix(spec, ".yml") && !strings.HasSuffix(spec, ".json") {
		return nil, fmt.Errorf("unknown preset %q; presets are %s, or give the path of a NodeTopology file", spec, strings.Join(Presets(), ", "))
	}
	data, err := os.ReadFile(spec)
	if err != nil {
		return nil, fmt.Errorf("read topology file: %w", err)
	}
	return v1alpha1.LoadNodeTopology(data, spec)
}

// Node is a simulated node. Its parts each keep their own state behind
// their own lock, and are embedded so that their methods are the node's:
// what each GPU's driver says beside its description (gpuStates), the
// GPUs' sharing settings (sharing.go), the processes it runs
// (processes.go), its kernel files and device nodes (devnodes.go) and
// its GPUs' MIG state (mig.go).
type Node struct {
	topo     *v1alpha1.NodeTopology
	nodeName string
	lib      *mock.Interface
	devices  []*mock.Device
	uuids    []string

	*gpuStates
	*sharing
	*processes
	*devNodes
	*migNode

	// mu guards sets, the event sets faults are delivered to.
	mu   sync.Mutex
	sets []*eventSet
	// calls counts NVML calls and fails those a test asks to (see
	// callfaults.go).
	calls callFaults
}

// New builds a simulated node. nodeName seeds the GPU UUIDs the
// description leaves out, so that nodes of one simulated cluster have
// distinct GPUs.
func New(topo *v1alpha1.NodeTopology, nodeName string) *Node {
	n := &Node{topo: topo, nodeName: nodeName}
	gpus := slices.Clone(topo.GPUs)
	slices.SortFunc(gpus, func(a, b v1alpha1.SimulatedGPU) int { return a.Index - b.Index })
	for _, g := range gpus {
		uuid := g.UUID
		if uuid == "" {
			uuid = DeriveUUID(nodeName, g.Index)
		}
		n.uuids = append(n.uuids, uuid)
	}
	n.gpuStates = newGPUStates(len(gpus))
	n.sharing = newSharing(n.gpuStates)
	n.processes = &processes{states: n.gpuStates}
	n.devNodes = &devNodes{topo: topo}
	n.migNode = &migNode{uuids: n.uuids, calls: &n.calls, states: n.gpuStates, procs: n.processes, dev: n.devNodes, gpus: map[int]*migGPU{}}
	for i := range gpus {
		n.devices = append(n.devices, n.newDevice(gpus, i))
	}
	n.lib = n.newInterface()
	return n
}

// Load is LoadTopology followed by New.
func Load(spec, nodeName string) (*Node, error) {
	topo, err := LoadTopology(spec)
	if err != nil {
		return nil, err
	}
	return New(topo, nodeName), nil
}

// NVML returns the simulated NVML library.
func (n *Node) NVML() nvml.Interface { return n.lib }

// PCIe returns the simulated node's PCIe placement.
func (n *Node) PCIe() inventory.PCIeTopology { return pcie{n.topo} }

// Topology returns the node's description.
func (n *Node) Topology() *v1alpha1.NodeTopology { return n.topo }

// DeriveUUID makes a stable, unique-looking GPU UUID from a node name and
// an index.
func DeriveUUID(nodeName string, index int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("kyb-simulated-gpu/%s/%d", nodeName, index)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

func (n *Node) newInterface() *mock.Interface {
	ok := func() nvml.Return { return nvml.SUCCESS }
	return &mock.Interface{
		InitFunc:           ok,
		ShutdownFunc:       ok,
		ErrorStringFunc:    nvmlErrorString,
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(n.devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(n.devices) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return n.devices[i], nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			for i, u := range n.uuids {
				if strings.EqualFold(u, uuid) {
					return n.devices[i], nvml.SUCCESS
				}
			}
			if ci, ok := n.deviceByUUID(uuid); ok {
				return ci.device, nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return n.topo.DriverVersion, nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) {
			major, minor := majorMinor(n.topo.CUDADriverVersion)
			return major*1000 + minor*10, nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) {
			return n.newEventSet(), nvml.SUCCESS
		},
	}
}

// newDevice is GPU i as go-nvml's mock device: what it is, its NVLinks,
// its place in the PCIe tree, and its health events.
func (n *Node) newDevice(gpus []v1alpha1.SimulatedGPU, i int) *mock.Device {
	g := gpus[i]
	d := &mock.Device{}
	n.describe(d, g, i)
	setNVLinks(d, n.ports(gpus, g))
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		j, ret := other.GetIndex()
		if ret != nvml.SUCCESS || j < 0 || j >= len(gpus) {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return commonAncestor(g, gpus[j]), nvml.SUCCESS
	}
	d.SetComputeModeFunc = func(mode nvml.ComputeMode) nvml.Return { return n.setComputeMode(g.Index, mode) }
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return n.computeMode(g.Index) }
	describeModes(d)
	n.attach(d, g)
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError | nvml.EventTypeGpuUnavailableError |
			nvml.EventTypeGpuRecoveryAction, nvml.SUCCESS
	}
	n.describeFields(d, g.Index)
	d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		es, ok := set.(*eventSet)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		es.register(g.Index, mask)
		return nvml.SUCCESS
	}
	return d
}

// describe sets what the GPU is: index, UUID, minor, PCI address, model
// and memory, and NUMA node. The calls a probe makes fail while a fault
// is injected.
func (n *Node) describe(d *mock.Device, g v1alpha1.SimulatedGPU, i int) {
	arch := inventory.ArchitectureCode(g.Architecture)
	ccMajor, ccMinor := majorMinor(g.CUDAComputeCapability)
	failing := func() nvml.Return { return n.failure(g.Index) }
	d.GetIndexFunc = func() (int, nvml.Return) { return g.Index, nvml.SUCCESS }
	d.GetUUIDFunc = func() (string, nvml.Return) {
		if ret := failing(); ret != nvml.SUCCESS {
			return "", ret
		}
		return n.uuids[i], nvml.SUCCESS
	}
	d.GetMinorNumberFunc = func() (int, nvml.Return) { return *g.Minor, nvml.SUCCESS }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(g.PCIBusID), nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) {
		if ret := failing(); ret != nvml.SUCCESS {
			return "", ret
		}
		return g.ProductName, nvml.SUCCESS
	}
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return arch, nvml.SUCCESS }
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return ccMajor, ccMinor, nvml.SUCCESS }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if ret := failing(); ret != nvml.SUCCESS {
			return nvml.Memory{}, ret
		}
		total := uint64(g.MemoryMiB) << 20
		used := min(n.memoryUsedMiB(g.Index)<<20, total)
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return n.runningProcesses(g.Index) }
	d.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return n.processUtilization(g.Index, lastSeen)
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return n.utilization(g.Index) }
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return *g.NUMANode, nvml.SUCCESS }
}

// port is one NVLink of a GPU and what is at its other end.
type port struct {
	peer   int // -1 for the NVSwitch
	remote string
}

// ports are a GPU's NVLinks: direct links first (by peer index), then the
// NVSwitch's.
func (n *Node) ports(gpus []v1alpha1.SimulatedGPU, g v1alpha1.SimulatedGPU) []port {
	var ports []port
	links := slices.Clone(g.NVLinks)
	slices.SortFunc(links, func(a, b v1alpha1.NVLink) int { return a.Peer - b.Peer })
	for _, l := range links {
		for range l.Links {
			ports = append(ports, port{peer: l.Peer, remote: gpus[l.Peer].PCIBusID})
		}
	}
	if n.topo.NVSwitch != nil {
		for k := range n.topo.NVSwitch.LinksPerGPU {
			// NVSwitches sit on their own PCI functions; the bus ID only
			// has to be one that no GPU has.
			ports = append(ports, port{peer: -1, remote: fmt.Sprintf("0000:fe:%02x.0", k%32)})
		}
	}
	return ports
}

// setNVLinks answers the NVLink queries over ports; a GPU without any
// answers NOT_SUPPORTED, as one without NVLink does.
func setNVLinks(d *mock.Device, ports []port) {
	hasNVLink := len(ports) > 0
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if !hasNVLink || link < 0 || link >= nvml.NVLINK_MAX_LINKS {
			if !hasNVLink {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if link < len(ports) {
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if link < 0 || link >= len(ports) {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
		}
		if ports[link].peer < 0 {
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
		return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		if link < 0 || link >= len(ports) {
			return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return pciInfo(ports[link].remote), nvml.SUCCESS
	}
}

func commonAncestor(a, b v1alpha1.SimulatedGPU) nvml.GpuTopologyLevel {
	switch {
	case a.Index == b.Index:
		return nvml.TOPOLOGY_INTERNAL
	case a.PCIeSwitch != "" && a.PCIeSwitch == b.PCIeSwitch:
		return nvml.TOPOLOGY_SINGLE
	case a.PCIeRoot == b.PCIeRoot:
		return nvml.TOPOLOGY_HOSTBRIDGE
	case *a.NUMANode == *b.NUMANode:
		return nvml.TOPOLOGY_NODE
	default:
		return nvml.TOPOLOGY_SYSTEM
	}
}

func pciInfo(busID string) nvml.PciInfo {
	var info nvml.PciInfo
	// NVML writes the 8-digit domain form.
	long := "0000" + busID
	copy(info.BusId[:], long)
	copy(info.BusIdLegacy[:], busID)
	return info
}

type pcie struct{ topo *v1alpha1.NodeTopology }

func (p pcie) PCIeRoot(busID string) (string, error) {
	for _, g := range p.topo.GPUs {
		if g.PCIBusID == busID {
			return g.PCIeRoot, nil
		}
	}
	return "", fmt.Errorf("simulated node has no PCI device %s", busID)
}

func (p pcie) NUMANode(busID string) (int, error) {
	for _, g := range p.topo.GPUs {
		if g.PCIBusID == busID {
			return *g.NUMANode, nil
		}
	}
	return -1, fmt.Errorf("simulated node has no PCI device %s", busID)
}

func nvmlErrorString(r nvml.Return) string {
	switch r {
	case nvml.SUCCESS:
		return "Success"
	case nvml.ERROR_NOT_SUPPORTED:
		return "Not Supported"
	case nvml.ERROR_INVALID_ARGUMENT:
		return "Invalid Argument"
	case nvml.ERROR_NOT_FOUND:
		return "Not Found"
	case nvml.ERROR_TIMEOUT:
		return "Timeout"
	case nvml.ERROR_GPU_IS_LOST:
		return "GPU is lost"
	case nvml.ERROR_UNKNOWN:
		return "Unknown Error"
	default:
		return fmt.Sprintf("NVML error %d", int(r))
	}
}

// Event is a fault to deliver through the simulated NVML event sets.
type Event struct {
	// GPU is the index of the GPU the event is about.
	GPU int
	// Type is an NVML event type mask bit, such as nvml.EventTypeXidCriticalError.
	Type uint64
	// Data is the event's payload: the XID for XID events.
	Data uint64
	// Instance, on a GPU in MIG mode, is the MIG instance the event is
	// about; nil: the whole GPU, which NVML says with 0xFFFFFFFF in both
	// ids.
	Instance *EventInstance
}

// EventInstance names the MIG instance of an event as NVML does: the GPU
// instance's ID and the compute instance's (NoInstanceID where the event
// is about the GPU instance as a whole).
type EventInstance struct {
	GPUInstance     uint32
	ComputeInstance uint32
}

// NoInstanceID is what NVML puts in an event's GpuInstanceId and
// ComputeInstanceId when the event is not about one MIG instance.
const NoInstanceID = 0xFFFFFFFF

// Inject delivers an event to every event set that registered for its type
// on that GPU, as NVML would after a fault.
func (n *Node) Inject(ev Event) error {
	if ev.GPU < 0 || ev.GPU >= len(n.devices) {
		return fmt.Errorf("simulated node has no GPU %d (%d GPUs)", ev.GPU, len(n.devices))
	}
	n.mu.Lock()
	sets := slices.Clone(n.sets)
	n.mu.Unlock()
	data := nvml.EventData{Device: n.devices[ev.GPU], EventType: ev.Type, EventData: ev.Data, GpuInstanceId: NoInstanceID, ComputeInstanceId: NoInstanceID}
	if ev.Instance != nil {
		// NVML hands MIG events out on the parent GPU's handle, the only
		// one events can be registered on.
		data.GpuInstanceId, data.ComputeInstanceId = ev.Instance.GPUInstance, ev.Instance.ComputeInstance
	}
	for _, s := range sets {
		s.deliver(data, ev.GPU)
	}
	return nil
}

func (n *Node) newEventSet() *eventSet {
	es := &eventSet{ch: make(chan nvml.EventData, 64), masks: map[int]uint64{}}
	es.node = n
	n.mu.Lock()
	n.sets = append(n.sets, es)
	n.mu.Unlock()
	return es
}

// eventSet implements nvml.EventSet; go-nvml's mock.EventSet would record
// every Wait call forever, which a health loop polling for days would turn
// into a leak.
type eventSet struct {
	node *Node
	ch   chan nvml.EventData

	mu    sync.Mutex
	masks map[int]uint64
	freed bool
}

var _ nvml.EventSet = (*eventSet)(nil)

func (s *eventSet) register(gpu int, mask uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.masks[gpu] |= mask
}

func (s *eventSet) deliver(ev nvml.EventData, gpu int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed || s.masks[gpu]&ev.EventType == 0 {
		return
	}
	select {
	case s.ch <- ev:
	default: // a real event set drops events when its queue is full, too
	}
}

func (s *eventSet) Wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case ev := <-s.ch:
		return ev, nvml.SUCCESS
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (s *eventSet) Free() nvml.Return {
	s.mu.Lock()
	s.freed = true
	s.mu.Unlock()
	n := s.node
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sets = slices.DeleteFunc(n.sets, func(x *eventSet) bool { return x == s })
	return nvml.SUCCESS
}

// majorMinor parses a "major.minor" version, which NodeTopology.Validate
// has checked; 0.0 if it does not parse.
func majorMinor(s string) (major, minor int) {
	if _, err := fmt.Sscanf(s, "%d.%d", &major, &minor); err != nil {
		return 0, 0
	}
	return major, minor
}
