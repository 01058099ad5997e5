package seatview

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// A group is blocked when what it consumes of the node's shared counters
// no longer fits beside what the held groups consume, as the scheduler's
// allocator decides. Whole-GPU groups consume all of each GPU's counter,
// so any held group on a GPU blocks the others there; a MIG device
// consumes one memory slice of eight of its GPU's counter (and its
// placement's slice counters), so instances beside each other do not
// block one another while they fit, but block the GPU's whole-GPU groups.

// counterUse is an amount per shared counter, "set/counter".
type counterUse map[string]int64

// consumption is what a device consumes of its node's shared counters.
func consumption(d resourceapi.Device) counterUse {
	out := counterUse{}
	for _, c := range d.ConsumesCounters {
		for name, v := range c.Counters {
			out[c.CounterSet+"/"+name] += v.Value.Value()
		}
	}
	return out
}

// addCapacities adds a slice's shared counters to caps.
func addCapacities(caps counterUse, s resourceapi.ResourceSlice) {
	for _, set := range s.Spec.SharedCounters {
		for name, v := range set.Counters {
			caps[set.Name+"/"+name] = v.Value.Value()
		}
	}
}

// add adds use to u.
func (u counterUse) add(use counterUse) {
	for c, v := range use {
		u[c] += v
	}
}

// over returns the counters need does not fit in beside used, sorted. A
// counter whose capacity no slice publishes fits only where unused.
func over(caps, used, need counterUse) []string {
	var out []string
	for c, v := range need {
		capacity, known := caps[c]
		if (known && used[c]+v > capacity) || (!known && used[c] > 0) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// fitMore counts how many more of the devices (one seat each, in the
// order given) fit beside used when taken one after the other, as the
// allocator takes them in the order a node publishes them.
func fitMore(caps, used counterUse, needs []counterUse) int {
	u := counterUse{}
	u.add(used)
	n := 0
	for _, need := range needs {
		if len(over(caps, u, need)) == 0 {
			u.add(need)
			n++
		}
	}
	return n
}
