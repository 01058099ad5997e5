package seatview

import (
	"strconv"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/fragmentation"
)

// The node's counter set of one counter per GPU, as the plugin publishes
// it (pkg/draresources: CounterSet, CounterName): "gpus/gpu3".
const (
	gpuCounterSet    = "gpus"
	gpuCounterPrefix = gpuCounterSet + "/gpu"
)

// measure is a node's fragmentation (package fragmentation) over the
// groups shown: a group's GPUs are the GPU counters it consumes, and it
// takes them whole where it consumes all of each; a held group holds the
// GPUs whose counters it consumes, whole or in part (a MIG instance). A
// group of an overprovisioning profile consumes no GPU counter: it takes
// no GPU whole and holds none, since the allocator still hands out the
// groups over its GPUs. On a node where no group consumes a GPU counter
// (the per-seat layout, which publishes none) each group takes the GPUs
// it names whole, as kyb-scheduler reads such a node.
func measure(node string, devices []string, groups map[groupKey]*Group, needs map[groupKey]counterUse, caps counterUse) fragmentation.Measure {
	counted := false
	for _, device := range devices {
		counted = counted || consumesGPUs(needs[groupKey{node, device}])
	}
	var all []fragmentation.Group
	var inUse []int
	for _, device := range devices {
		key := groupKey{node, device}
		g := groups[key]
		fg := fragmentation.Group{GPUs: g.GPUs, Whole: true, Unhealthy: g.State == StateUnhealthy}
		if counted {
			fg.GPUs, fg.Whole = gpuCounters(needs[key], caps)
			if len(fg.GPUs) == 0 {
				fg.GPUs = g.GPUs
			}
		}
		all = append(all, fg)
		if g.HeldSeats > 0 && (!counted || consumesGPUs(needs[key])) {
			inUse = append(inUse, fg.GPUs...)
		}
	}
	return fragmentation.Of(all, inUse)
}

// gpuCounters are the GPUs whose counters need consumes, and whether it
// consumes all of each (false where it consumes none).
func gpuCounters(need, caps counterUse) ([]int, bool) {
	var gpus []int
	whole := true
	for c, v := range need {
		i, err := strconv.Atoi(strings.TrimPrefix(c, gpuCounterPrefix))
		if !strings.HasPrefix(c, gpuCounterPrefix) || err != nil || v <= 0 {
			continue
		}
		gpus = append(gpus, i)
		whole = whole && v >= caps[c]
	}
	return gpus, whole && len(gpus) > 0
}

func consumesGPUs(need counterUse) bool {
	for c, v := range need {
		if strings.HasPrefix(c, gpuCounterPrefix) && v > 0 {
			return true
		}
	}
	return false
}
