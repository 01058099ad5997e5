// Package fragmentation measures how a node's free GPUs are broken up:
// the free GPUs outside any free group of the largest size the node
// publishes. A request of that size cannot use them, however many there
// are, until the pods beside them leave. It is the placement study's
// figure (docs/placement-study.md, there against four-GPU groups), here
// against each node's own largest group, and the one definition that
// kyb-scheduler's metrics and `kubectl kyb seats` both report.
//
// The measure is over a node's published groups and the GPUs that
// allocations hold; callers read both from the ResourceSlices and the
// allocated devices as the scheduler's allocator does:
//
//   - A GPU is in use when an allocation holds any of it: a seat of a
//     group (a share of a shared group too), or a MIG instance on it. A
//     GPU partly partitioned is not free: no group that takes it whole
//     fits beside the instance.
//   - A seat of an overprovisioning profile consumes no counter: the
//     allocator still hands out a whole group over its GPUs, so it leaves
//     them free here. Where no group of a node consumes a GPU counter
//     (the per-seat layout, which publishes none: its groups that exclude
//     each other never overlap) every held group holds its GPUs.
//   - A GPU on which every published group is unhealthy (tainted
//     NoSchedule or NoExecute) takes no seat: it is neither free nor in
//     use, and an unhealthy group is never a free group.
//   - The largest size is that of the node's largest healthy group that
//     takes its GPUs whole. A node whose largest group is one GPU has
//     nothing fragmented where every GPU has its one-GPU group, and a
//     node with no such group at all (MIG instances or overprovisioning
//     groups alone) has nothing fragmented.
//   - A free GPU that no free group of the largest size covers counts,
//     whatever keeps it out: the pods beside it, or a node whose largest
//     groups do not reach it (a six-GPU node with one four-GPU group has
//     two fragmented GPUs while empty: no request of four can use them).
package fragmentation

import "slices"

// Group is one group a node publishes, as the measure needs it.
type Group struct {
	// GPUs are the indices of the group's GPUs on its node.
	GPUs []int
	// Whole: a seat of the group takes all of each of its GPUs, so that
	// the group fits only where they are all free. False for a MIG
	// instance (part of one GPU) and for a group of an overprovisioning
	// profile (it consumes no counter).
	Whole bool
	// Unhealthy: the group has a NoSchedule or NoExecute taint: no new
	// claim is allocated there.
	Unhealthy bool
}

// Measure is one node's figures, or the cluster's sum of them.
type Measure struct {
	// Free GPUs: no allocation holds any of them, and a healthy group
	// covers them.
	Free int `json:"free"`
	// Largest is the GPUs of the node's largest healthy group that takes
	// its GPUs whole, 0 where it has none; of a cluster, the largest of
	// its nodes'.
	Largest int `json:"largestGroup"`
	// Inside: free GPUs inside a free group of the largest size (healthy,
	// every GPU of it free).
	Inside int `json:"inside"`
	// Fragmented: free GPUs outside every such group, Free - Inside.
	Fragmented int `json:"fragmented"`
}

// Of measures a node: its published groups and the indices of the GPUs
// allocations hold (in any order, repeats allowed).
func Of(groups []Group, inUse []int) Measure {
	busy := make(map[int]bool, len(inUse))
	for _, i := range inUse {
		busy[i] = true
	}
	healthy := map[int]bool{}
	largest := 0
	for _, g := range groups {
		if g.Unhealthy {
			continue
		}
		for _, i := range g.GPUs {
			healthy[i] = true
		}
		if g.Whole {
			largest = max(largest, distinct(g.GPUs))
		}
	}
	var m Measure
	m.Largest = largest
	for i := range healthy {
		if !busy[i] {
			m.Free++
		}
	}
	if largest == 0 {
		// No request takes GPUs whole here.
		m.Inside = m.Free
		return m
	}
	inside := map[int]bool{}
	for _, g := range groups {
		if g.Unhealthy || !g.Whole || distinct(g.GPUs) != largest || slices.ContainsFunc(g.GPUs, func(i int) bool { return busy[i] }) {
			continue
		}
		for _, i := range g.GPUs {
			inside[i] = true
		}
	}
	m.Inside = len(inside)
	m.Fragmented = m.Free - m.Inside
	return m
}

// Add adds a node's figures to a cluster's: counts add up, the largest
// size is the largest of the two.
func (m *Measure) Add(n Measure) {
	m.Free += n.Free
	m.Inside += n.Inside
	m.Fragmented += n.Fragmented
	m.Largest = max(m.Largest, n.Largest)
}

// Share is the fragmented share of the free GPUs, 0 where none is free.
func (m Measure) Share() float64 {
	if m.Free == 0 {
		return 0
	}
	return float64(m.Fragmented) / float64(m.Free)
}

// distinct counts the GPUs of a group, each once: a group names a few.
func distinct(gpus []int) int {
	n := 0
	for k, i := range gpus {
		if !slices.Contains(gpus[:k], i) {
			n++
		}
	}
	return n
}
