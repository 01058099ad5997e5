package placement

import (
	"cmp"
	"encoding/binary"
	"slices"
)

// The idle larger groups each device of a pool breaks, for the device
// order.
//
// A device breaks a group that is larger, exclusive (it consumes its
// GPUs' counters), untainted, idle (none of its GPUs busy) and overlaps
// it. Asked of every group for every device, that is a pass over the
// pool per device, quadratic in a pool whose size its node decides: a
// node publishing 32,768 devices in its own pool cost the order 10 s.
// Here the idle groups are listed by GPU once, so that a device looks
// only at the groups over its own GPUs, largest first, and stops at
// those no larger than itself: a device of one GPU counts its GPU's
// list without reading it, and devices of one GPU set (a group
// published again under another name, a GPU's MIG instances, the seats
// of the per-seat layout) are counted once. A pool of the driver's
// shapes, however often repeated, costs a pass over its devices' GPUs.
// Devices of many distinct sets of several GPUs each cost the groups
// over their GPUs, which the bound on a pool (maxPoolDevices) keeps
// small.

// breakIndex is the idle larger groups of a pool by GPU, and the counts
// made from them; a scratch's, reused from pool to pool.
type breakIndex struct {
	// groups[start[g]:start[g+1]] are the idle groups of two GPUs or more
	// over GPU g, by device index, largest first.
	start, groups []int32
	// idle: the candidates, largest first.
	idle []int32
	// stamp and epoch count a group once where it covers several of a
	// device's GPUs.
	stamp []uint32
	epoch uint32
	// bySet: the counts of the GPU sets of several GPUs counted so far,
	// by their words (byWord where one word holds them).
	byWord map[uint64]int
	bySet  map[string]int
	key    []byte
	// visits counts the list entries read, for the test that the work
	// grows with the pool, not with its square.
	visits int
}

// count returns, for every device of p, the idle larger groups it
// breaks while busy are the GPUs in use, in out.
func (x *breakIndex) count(p *pool, busy gpuSet, out []int) []int {
	out = resize(out, len(p.devices))
	x.visits = 0
	x.build(p, busy)
	if x.byWord == nil {
		x.byWord, x.bySet = map[uint64]int{}, map[string]int{}
	}
	clear(x.byWord)
	clear(x.bySet)
	for i, d := range p.devices {
		switch {
		case d.size == 0:
		case d.size == 1:
			g := d.gpus.bound() - 1
			out[i] = int(x.start[g+1] - x.start[g])
		case len(d.gpus) == 1:
			n, ok := x.byWord[d.gpus[0]]
			if !ok {
				n = x.overlapping(p, d)
				x.byWord[d.gpus[0]] = n
			}
			out[i] = n
		default:
			// GPU indices past 63: no pool of the driver's.
			x.key = x.key[:0]
			for _, w := range d.gpus {
				x.key = binary.LittleEndian.AppendUint64(x.key, w)
			}
			n, ok := x.bySet[string(x.key)]
			if !ok {
				n = x.overlapping(p, d)
				x.bySet[string(x.key)] = n
			}
			out[i] = n
		}
	}
	return out
}

// build lists the pool's idle groups of two GPUs or more by GPU.
func (x *breakIndex) build(p *pool, busy gpuSet) {
	x.idle = x.idle[:0]
	for i, d := range p.devices {
		if d.exclusive && !d.tainted && d.size > 1 && !busy.overlaps(d.gpus) {
			x.idle = append(x.idle, int32(i))
		}
	}
	slices.SortStableFunc(x.idle, func(a, b int32) int { return cmp.Compare(p.devices[b].size, p.devices[a].size) })
	x.start = resize(x.start, p.gpus+2)
	for _, i := range x.idle {
		p.devices[i].gpus.each(func(g int) { x.start[g+2]++ })
	}
	for g := 2; g < len(x.start); g++ {
		x.start[g] += x.start[g-1]
	}
	// start[g+1] is where GPU g's list is filled up to; once filled, it is
	// where the list of g+1 begins.
	x.groups = resize(x.groups, int(x.start[len(x.start)-1]))
	for _, i := range x.idle {
		p.devices[i].gpus.each(func(g int) {
			x.groups[x.start[g+1]] = i
			x.start[g+1]++
		})
	}
	x.visits += len(x.groups)
	if len(x.stamp) < len(p.devices) {
		x.stamp = make([]uint32, len(p.devices))
		x.epoch = 0
	}
}

// overlapping counts the idle groups larger than d over its GPUs, each
// once.
func (x *breakIndex) overlapping(p *pool, d *device) int {
	x.epoch++
	if x.epoch == 0 {
		clear(x.stamp)
		x.epoch = 1
	}
	n := 0
	d.gpus.each(func(g int) {
		for _, b := range x.groups[x.start[g]:x.start[g+1]] {
			x.visits++
			if p.devices[b].size <= d.size {
				break
			}
			if x.stamp[b] != x.epoch {
				x.stamp[b] = x.epoch
				n++
			}
		}
	})
	return n
}
