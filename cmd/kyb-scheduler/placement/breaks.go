package placement

import (
	"math/bits"
	"sort"
)

// The idle larger groups each device of a pool breaks, for the device
// order.
//
// A device breaks a group that is larger, exclusive (it consumes its
// GPUs' counters), untainted, idle (none of its GPUs busy) and overlaps
// it. Asked of every group for every device, that is a pass over the
// pool per device, quadratic in a pool whose size its node decides: a
// node publishing 32,768 devices in its own pool cost the order seconds
// each time its slices or allocations changed. Here the idle groups,
// largest first, are a set of bits per GPU, made once: a device of one
// GPU counts its GPU's bits, made with them; a device of several GPUs
// counts the union of its GPUs' sets, a word at a time, over the groups
// larger than itself; devices of one GPU set (a group published again
// under another name, a GPU's MIG instances, the seats of the per-seat
// layout) are counted once. A pool of the driver's shapes, however often
// repeated, costs a pass over its devices' GPUs; a pool of many distinct
// sets of several GPUs, a word per 64 idle groups for each GPU of each
// set, which the bounds on a pool (maxPoolDevices devices, gpuIndexLimit
// GPUs) keep to milliseconds.

// breakIndex is the idle larger groups of a pool by GPU, and the counts
// made from them; a scratch's, reused from pool to pool.
type breakIndex struct {
	// idle: the pool's idle groups of two GPUs or more, largest first,
	// in the pool's order among groups of one size; bySize places them.
	idle   []int32
	bySize []int
	// words: the words of a GPU's set; over[g*words:(g+1)*words] has bit
	// k set where idle[k] is over GPU g, and groups[g] is how many are.
	words  int
	over   []uint64
	groups []int
	// counted: the counts of the GPU sets of several GPUs made so far.
	counted map[uint64]int
	// visits counts the words read, for the test that the work grows
	// with the pool, not with its square.
	visits int
}

// count returns, for every device of p, the idle larger groups it
// breaks while busy are the GPUs in use, in out.
func (x *breakIndex) count(p *pool, busy gpuSet, out []int) []int {
	out = resize(out, len(p.devices))
	x.visits = 0
	x.build(p, busy)
	if x.counted == nil {
		x.counted = map[uint64]int{}
	}
	clear(x.counted)
	for i, d := range p.devices {
		switch {
		case d.size == 0:
		case d.size == 1:
			out[i] = x.groups[d.gpus.bound()-1]
		case len(d.gpus) == 1:
			// Every set of one word, as gpuIndexLimit keeps them.
			n, ok := x.counted[d.gpus[0]]
			if !ok {
				n = x.overlapping(p, d)
				x.counted[d.gpus[0]] = n
			}
			out[i] = n
		default:
			out[i] = x.overlapping(p, d)
		}
	}
	return out
}

// build makes the sets of the pool's idle groups of two GPUs or more, by
// GPU.
func (x *breakIndex) build(p *pool, busy gpuSet) {
	// Largest first, by a count of each size: a group has at most the
	// pool's GPUs.
	x.bySize = resize(x.bySize, p.gpus+2)
	n := 0
	for _, d := range p.devices {
		if d.exclusive && !d.tainted && d.size > 1 && !busy.overlaps(d.gpus) {
			x.bySize[p.gpus-d.size+1]++
			n++
		}
	}
	for k := 1; k < len(x.bySize); k++ {
		x.bySize[k] += x.bySize[k-1]
	}
	x.idle = resize(x.idle, n)
	for i, d := range p.devices {
		if d.exclusive && !d.tainted && d.size > 1 && !busy.overlaps(d.gpus) {
			x.idle[x.bySize[p.gpus-d.size]] = int32(i)
			x.bySize[p.gpus-d.size]++
		}
	}
	x.words = (len(x.idle) + 63) / 64
	x.over = resize(x.over, p.gpus*x.words)
	x.groups = resize(x.groups, p.gpus)
	for k, i := range x.idle {
		p.devices[i].gpus.each(func(g int) {
			x.over[g*x.words+k/64] |= 1 << (k % 64)
			x.groups[g]++
		})
	}
	x.visits += len(x.over)
}

// overlapping counts the idle groups larger than d over its GPUs, each
// once.
func (x *breakIndex) overlapping(p *pool, d *device) int {
	// The groups larger than d: a prefix of idle.
	larger := sort.Search(len(x.idle), func(k int) bool { return p.devices[x.idle[k]].size <= d.size })
	n := 0
	for w := 0; w*64 < larger; w++ {
		var union uint64
		d.gpus.each(func(g int) { union |= x.over[g*x.words+w] })
		x.visits += d.size
		if rest := larger - w*64; rest < 64 {
			union &= 1<<rest - 1
		}
		n += bits.OnesCount64(union)
	}
	return n
}
