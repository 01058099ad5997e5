package placement

import (
	"context"

	"k8s.io/dynamic-resource-allocation/cel"
)

// outcome is what the pod's requests would take of one node's pool, the
// way the allocator takes it: the first device in the pool's order that
// the request's class selects and that has room, request after request.
//
// The DynamicResources plugin's Filter has already made that choice for
// this node, but keeps it in its cycle state under a type of its own
// (unexported in k8s.io/kubernetes v1.37.1), so the score makes it again
// from the same allocated state, with counters and seats alone: no CEL of
// the request's own selectors, no tolerations, no admin access. Where
// those make the allocator choose another device the prediction is off
// for that node's score, never for whether the pod fits (Filter decides
// that). A pool where no device has room for a request is "not predicted"
// and ranks last under topology.
type outcome struct {
	// ours: some request takes a device of ours on this node.
	ours bool
	// predicted: every request of ours found a device with room.
	predicted bool
	// gpus the node has, busy of them before the pod.
	gpus, busy int
	// picks: devices taken; joined: of them, those taken where the GPUs
	// already were in use before the pod (a share of a shared group in
	// use, a MIG instance on a GPU already partitioned).
	picks, joined int
	// broken: larger groups whose GPUs were all idle before the pod and
	// that the pod's groups overlap: an island the next request of that
	// size no longer finds whole.
	broken int
	// takenBelow[j]: the GPUs the pod's devices of fewer than
	// largerSizes[j] GPUs take, for the bound on a node's word (trust.go).
	takenBelow [len(largerSizes)]int
	// sized: the sized groups the pod takes; leftMiB, the memory they
	// have left after it, in MiB (sizes.go).
	sized   int
	leftMiB int64
}

// nodeUse is the allocation state of one pool while a pod is placed on it.
type nodeUse struct {
	allocs
	// busy: GPUs of devices in use.
	busy gpuSet
	// used is what the devices in use consume of each counter; capacity
	// (the pool's) what each holds.
	used, capacity []int64
}

// restore makes u the pool's state before the pod from the allocations
// an order was computed for, in u's own buffers, without looking them up.
func (u *nodeUse) restore(p *pool, o *ordered) {
	u.assign(&o.allocs)
	u.used = resize(u.used, len(p.capacity))
	u.busy = resize(u.busy, 0)
	u.capacity = p.capacity
	for i, d := range p.devices {
		if u.inUse[i] {
			u.busy.addAll(d.gpus)
			u.charge(d)
		}
	}
}

// copyFrom makes u a copy of o, in u's own buffers.
func (u *nodeUse) copyFrom(o *nodeUse) {
	u.assign(&o.allocs)
	u.used = append(u.used[:0], o.used...)
	u.busy = append(u.busy[:0], o.busy...)
	u.capacity = o.capacity
}

// resize returns s with n zero elements, reusing its array where it is
// large enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// charge adds what d consumes to the counters: once per device, at its
// first allocation (a shared device's later shares take seats alone).
func (u *nodeUse) charge(d *device) {
	for _, c := range d.consumes {
		u.used[c.counter] += c.amount
	}
}

// room says whether every counter d consumes has room for it.
func (u *nodeUse) room(d *device) bool {
	for _, c := range d.consumes {
		if u.used[c.counter]+c.amount > u.capacity[c.counter] {
			return false
		}
	}
	return true
}

// fits says whether device d can take another allocation for alt: one
// that publishes every capacity alt names; a sized group with room for
// its size; a shared device in use by its remaining seats (its counters
// were charged with its first share), any other by its counters.
func (u *nodeUse) fits(i int, d *device, alt *alternative) bool {
	if d.tainted || alt.seats > d.seats || !d.publishes(alt.names) {
		return false
	}
	if d.sized != nil && !u.sizeFits(i, d.sized, alt) {
		return false
	}
	if d.shared && u.inUse[i] {
		return u.seats[i]+alt.seats <= d.seats
	}
	if u.inUse[i] {
		return false
	}
	return u.room(d)
}

func (u *nodeUse) take(i int, d *device, alt *alternative) {
	first := !u.inUse[i]
	u.inUse[i] = true
	if d.shared {
		u.seats[i] += alt.seats
	}
	if d.sized != nil {
		memory, compute, _ := d.sized.size(alt)
		u.memory[i] += memory
		u.compute[i] += compute
	}
	u.busy.addAll(d.gpus)
	if first {
		u.charge(d)
	}
}

// scratch is one prediction's working state, reused from node to node
// and pod to pod: the score predicts every node that fits, for every
// pod, and a few small buffers per node were most of its cost.
type scratch struct {
	use, trial    nodeUse
	before        gpuSet
	inUseBefore   []bool
	picked, taken []int
	// breaks and broken: the device order's count of the groups each
	// device breaks.
	breaks breakIndex
	broken []int
	// below: the GPUs the pod's devices smaller than each of largerSizes
	// take.
	below [len(largerSizes)]gpuSet
}

// predict places reqs on the pool as the allocator would, from the
// pool's state under the cycle's allocations: in the order the cycle's
// allocator got (order.go) where the cycle ordered the devices (ordered),
// else in the published order.
func predict(ctx context.Context, celCache *cel.Cache, p *pool, reqs []request, ordered bool, st *ordered, s *scratch) outcome {
	o := outcome{predicted: true, gpus: p.gpus}
	use, trial := &s.use, &s.trial
	use.restore(p, st)
	order := p.published()
	if ordered {
		order = st.order
	}
	s.before = append(s.before[:0], use.busy...)
	o.busy = s.before.count()
	s.inUseBefore = append(s.inUseBefore[:0], use.inUse...)
	s.picked = s.picked[:0]
	for _, r := range reqs {
		mine := false
		placed := false
		for j := range r.alternatives {
			alt := &r.alternatives[j]
			matches := p.classMatches(ctx, celCache, alt.class, alt.classKey)
			if anyTrue(matches) {
				mine = true
			}
			// An alternative that falls short is undone whole: its takes
			// go to a copy. One device needs none, it takes all or nothing.
			into := use
			if alt.count > 1 {
				trial.copyFrom(use)
				into = trial
			}
			s.taken = s.taken[:0]
			// The allocator looks for a request's next device after the
			// one it took last (combinations, not permutations): a
			// shared group with seats left gives a request one device,
			// not two.
			from := 0
			for n := int64(0); n < alt.count; n++ {
				k := firstFit(into, p, order, from, matches, alt)
				if k < 0 {
					break
				}
				i := order[k]
				from = k + 1
				into.take(i, p.devices[i], alt)
				s.taken = append(s.taken, i)
			}
			if int64(len(s.taken)) == alt.count && len(s.taken) > 0 {
				if into != use {
					use, trial = trial, use
				}
				s.picked = append(s.picked, s.taken...)
				placed = true
				break
			}
		}
		if mine && !placed {
			o.predicted = false
		}
		o.ours = o.ours || mine
	}
	o.picks = len(s.picked)
	o.leftMiB, o.sized = leftMiB(p, use, s.picked)
	for j := range s.below {
		s.below[j] = s.below[j][:0]
	}
	for _, i := range s.picked {
		d := p.devices[i]
		if d.joins(s.inUseBefore[i], s.before) {
			o.joined++
		}
		for j, size := range largerSizes {
			if d.size < size {
				s.below[j].addAll(d.gpus)
			}
		}
	}
	for j := range s.below {
		o.takenBelow[j] = s.below[j].count()
	}
	for _, big := range p.devices {
		if !big.exclusive || big.tainted || s.before.overlaps(big.gpus) {
			continue
		}
		for _, i := range s.picked {
			if d := p.devices[i]; big.size > d.size && big.gpus.overlaps(d.gpus) {
				o.broken++
				break
			}
		}
	}
	return o
}

// firstFit is the position in order, from on, of the first device that
// the class selects and that has room, -1 if none.
func firstFit(u *nodeUse, p *pool, order []int, from int, matches []bool, alt *alternative) int {
	for k := from; k < len(order); k++ {
		if i := order[k]; matches[i] && u.fits(i, p.devices[i], alt) {
			return k
		}
	}
	return -1
}

func anyTrue(b []bool) bool {
	for _, v := range b {
		if v {
			return true
		}
	}
	return false
}

// Keys order the nodes under a policy, larger first; NormalizeScore maps
// them onto 0..100. Each part is in per mille (broken groups: a count up
// to maxBroken; whether the node is in use: 0 or 1; the memory a sized
// pod leaves: MiB up to maxLeftMiB), so that a later part only tells
// apart nodes the earlier ones find equal.
const (
	permilleSpan = 1001
	maxBroken    = 999
	// maxLeftMiB bounds the memory left counted: 2 TiB, more than the
	// sized groups of one pod have.
	maxLeftMiB = 1<<21 - 1
	leftSpan   = maxLeftMiB + 1
	// restSpan holds what comes after broken groups (fill and join; for
	// a sized pod join, memory left and fill); brokenSpan the broken
	// groups above them; packSpan all of pack's key. Topology's key, a
	// count of broken groups above pack's, stays below 2^62.
	restSpan   = permilleSpan * leftSpan * permilleSpan
	brokenSpan = (maxBroken + 1) * restSpan
	packSpan   = 2 * brokenSpan
)

func permille(n, of int) int64 {
	if of <= 0 {
		return 0
	}
	return int64(min(n, of)) * 1000 / int64(of)
}

// key: pack ranks the nodes already in use first, so that empty nodes
// stay whole; among them the one where the pod breaks the fewest idle
// larger groups (topology as its tie-break), then the fullest, then the
// one where it joins the most GPUs in use. Topology ranks by broken
// groups first, then as pack. Spread prefers the emptiest node, then the
// one it joins least.
//
// Pack's broken groups come before fill: ranking the fullest node first
// breaks, on it, a pair or a quad that a node a little less full would
// have kept, and left more of the cluster's free GPUs outside any whole
// larger group (docs/placement-study.md, "Through the real scheduler").
//
// A pod that takes sized groups packs by what is left: after the broken
// groups, the node where it joins groups in use, then where its groups
// have the least memory left after it (best fit: the groups with much
// left stay for the large requests), then the fullest. Joining comes
// before memory left so that a group in use on a node of larger GPUs is
// still taken before an idle GPU elsewhere.
func (o outcome) key(policy Policy) int64 {
	if !o.ours {
		return 0
	}
	fill := permille(o.busy, o.gpus)
	join := permille(o.joined, o.picks)
	broken := int64(min(o.broken, maxBroken))
	if !o.predicted {
		broken = maxBroken
	}
	used := int64(0)
	if o.busy > 0 {
		used = 1
	}
	rest := fill*permilleSpan + join
	if o.sized > 0 {
		rest = join*leftSpan*permilleSpan + (maxLeftMiB-min(o.leftMiB, maxLeftMiB))*permilleSpan + fill
	}
	pack := used*brokenSpan + (maxBroken-broken)*restSpan + rest
	switch policy {
	case Spread:
		return (1000-fill)*permilleSpan + (1000 - join)
	case Topology:
		return (maxBroken-broken)*packSpan + pack
	default:
		return pack
	}
}
