package placement

// What the score takes from a node's own word.
//
// Everything the score reads of a node, its GPUs, its groups, their seats
// and counters, is what the node publishes, and a node broken into
// publishes what it likes in its own pool (the slice admission policy
// keeps it to that pool and to the driver's largest size). The score
// cannot tell a lie from an honest node configured otherwise: a node
// publishing only one-GPU groups never breaks a larger group, as an
// honest node configured without larger profiles does not. What it can
// bound is how much better than an honest node with the same GPUs such a
// node looks.
//
// An honest node forms groups of each larger size over all of its GPUs
// that the size divides: of n GPUs, at most n mod S lie outside every
// group of S. On a node with no GPU in use, a pod whose devices of fewer
// than S GPUs take more GPUs than that breaks at least one idle group of
// S, however the groups lie. Where the cluster publishes groups of S
// (some pool of ours has an exclusive group of that size), the score
// counts at least that many broken groups on an idle node, whatever the
// node publishes: a node that publishes no larger groups ranks, empty,
// with an honest empty node of its GPU count, not above it, under pack
// and topology alike. Once a GPU is in use an honest node's groups may
// lie so that the pod breaks none (beside the busy GPU), so nothing is
// added there: such a node then ranks as an honest node whose free GPUs
// all sit beside GPUs in use. docs/security.md says what that leaves.
//
// The bound counts the GPUs the pod's devices take as the node names
// them: by the counters a device consumes, else by its gpuIndices. A
// device that names no GPU below the driver's 32 takes none, and the
// bound adds nothing: a node of such devices would rank, empty, above
// honest empty nodes. Every device the driver publishes names its GPUs
// (by gpuIndices alone where it consumes no counter: the per-seat layout,
// an overprovisioning profile), so a pool with one that names none is no
// pool of the driver's as it runs: like a pool larger than the driver
// publishes, it is left to the allocator in its published order and
// scored as not ours, below every node of ours. Taking such a device as
// one GPU instead would still trust the node's GPU count, which the same
// node can drop with its counters.

// largerSizes are the group sizes a device can break (the driver's group
// sizes but one GPU), as a bit each in poolSet.larger.
var largerSizes = [...]int{2, 4, 8}

// sizeBits is the bit of each of largerSizes among sizes.
func sizeBits(size int) uint8 {
	for j, s := range largerSizes {
		if s == size {
			return 1 << j
		}
	}
	return 0
}

// bounded is o with at least the broken groups an honest node of its
// GPUs, idle, would count, for the larger sizes the cluster publishes.
func (o outcome) bounded(larger uint8) outcome {
	if !o.ours || !o.predicted || o.busy > 0 {
		return o
	}
	least := 0
	for j, size := range largerSizes {
		if larger&(1<<j) == 0 || size > o.gpus {
			continue
		}
		if taken := o.takenBelow[j]; taken > 0 && o.gpus%size < taken {
			least++
		}
	}
	o.broken = max(o.broken, least)
	return o
}

// unplaced is a device of the pool that names no GPU of ours, nil where
// every one names some.
func (p *pool) unplaced() *device {
	for _, d := range p.devices {
		if d.size == 0 {
			return d
		}
	}
	return nil
}
