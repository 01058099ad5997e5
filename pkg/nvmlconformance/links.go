package nvmlconformance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// links asks each GPU for its NVLinks and each pair for its PCIe common
// ancestor as discovery does, which stops at the first link answering
// ERROR_NOT_SUPPORTED or ERROR_INVALID_ARGUMENT (no more links; a GPU
// without NVLink, such as one in a VM, answers so for link 0) and fails
// on any other error: an active link names its remote end, an NVSwitch or
// a PCI device; every pair has one common ancestor, the same both ways.
func (s *suite) links() Result {
	var p problems
	byBus := map[string]int{}
	for _, g := range s.gpus {
		byBus[g.busID] = g.index
	}
	var perGPU []gpuLine
	for _, g := range s.gpus {
		var active, toSwitch, toGPU int
		stop := ""
		for link := 0; link < nvml.NVLINK_MAX_LINKS && stop == ""; link++ {
			state, ret := g.dev.GetNvLinkState(link)
			switch ret {
			case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
				stop = fmt.Sprintf("link %d %s", link, s.errorString(ret))
				continue
			case nvml.SUCCESS:
			default:
				p.add("GPU %d: GetNvLinkState(%d): %s, which fails discovery", g.index, link, s.errorString(ret))
				stop = "error"
				continue
			}
			if state != nvml.FEATURE_ENABLED {
				continue
			}
			active++
			if kind, ret := g.dev.GetNvLinkRemoteDeviceType(link); ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH {
				toSwitch++
				continue
			}
			remote, ret := g.dev.GetNvLinkRemotePciInfo(link)
			if ret != nvml.SUCCESS {
				p.add("GPU %d: active link %d: GetNvLinkRemotePciInfo: %s, which fails discovery", g.index, link, s.errorString(ret))
				continue
			}
			bus, err := inventory.NormalizeBusID(cString(remote.BusId[:]))
			if err != nil {
				p.add("GPU %d: active link %d: %v", g.index, link, err)
				continue
			}
			if peer, ok := byBus[bus]; ok && peer != g.index {
				toGPU++
			}
		}
		line := fmt.Sprintf("%d active NVLinks (%d to GPUs, %d to NVSwitches)", active, toGPU, toSwitch)
		if active == 0 && strings.HasPrefix(stop, "link 0 ") {
			line = "no NVLink (" + stop + ")"
		}
		perGPU = append(perGPU, gpuLine{g.index, line})
	}
	levels := map[string]int{}
	for a, ga := range s.gpus {
		for _, gb := range s.gpus[a+1:] {
			ab, ret := ga.dev.GetTopologyCommonAncestor(gb.dev)
			if ret != nvml.SUCCESS {
				p.add("GPUs %d and %d: GetTopologyCommonAncestor: %s, which fails discovery", ga.index, gb.index, s.errorString(ret))
				continue
			}
			ba, ret := gb.dev.GetTopologyCommonAncestor(ga.dev)
			if ret != nvml.SUCCESS || ba != ab {
				p.add("GPUs %d and %d: the common ancestor is %d one way and %d (%s) the other", ga.index, gb.index, ab, ba, s.errorString(ret))
				continue
			}
			if !slices.Contains(topologyLevels, ab) {
				p.add("GPUs %d and %d: common ancestor %d is not a topology level", ga.index, gb.index, ab)
				continue
			}
			levels[levelName(ab)]++
		}
	}
	var pairs []string
	for _, l := range topologyLevels {
		if n := levels[levelName(l)]; n > 0 {
			pairs = append(pairs, fmt.Sprintf("%d %s", n, levelName(l)))
		}
	}
	found := grouped(perGPU)
	if len(pairs) > 0 {
		found += "; pairs: " + strings.Join(pairs, ", ")
	}
	return p.result(CheckLinks, NodeWide, found)
}

// topologyLevels are the common ancestors NVML names, nearest first.
var topologyLevels = []nvml.GpuTopologyLevel{nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_SINGLE, nvml.TOPOLOGY_MULTIPLE,
	nvml.TOPOLOGY_HOSTBRIDGE, nvml.TOPOLOGY_NODE, nvml.TOPOLOGY_SYSTEM}

func levelName(l nvml.GpuTopologyLevel) string {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return "same board"
	case nvml.TOPOLOGY_SINGLE:
		return "one PCIe switch"
	case nvml.TOPOLOGY_MULTIPLE:
		return "PCIe switches"
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return "host bridge"
	case nvml.TOPOLOGY_NODE:
		return "NUMA node"
	}
	return "system"
}
