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
	// picks: devices taken; joined: of them, shared groups already in use
	// before the pod (a seat taken where the GPUs already are).
	picks, joined int
	// broken: larger groups whose GPUs were all idle before the pod and
	// that the pod's groups overlap: an island the next request of that
	// size no longer finds whole.
	broken int
}

// nodeUse is the allocation state of one pool while a pod is placed on it.
type nodeUse struct {
	inUse []bool
	seats []int64
	// busy: GPUs of devices in use; held: GPUs whose counters a device in
	// use consumes, which no other exclusive device can take.
	busy, held gpuSet
}

func newNodeUse(p *pool, a *allocated) *nodeUse {
	u := &nodeUse{inUse: make([]bool, len(p.devices)), seats: make([]int64, len(p.devices))}
	for i, d := range p.devices {
		inUse, seats := a.use(d)
		if !inUse {
			continue
		}
		u.inUse[i] = true
		u.seats[i] = seats
		u.busy.addAll(d.gpus)
		if d.exclusive {
			u.held.addAll(d.gpus)
		}
	}
	return u
}

func (u *nodeUse) clone() *nodeUse {
	return &nodeUse{inUse: append([]bool(nil), u.inUse...), seats: append([]int64(nil), u.seats...), busy: u.busy.clone(), held: u.held.clone()}
}

// fits says whether device d can take another allocation of seats: a
// shared device in use by its remaining seats (its counters were charged
// with its first share), any other by its counters.
func (u *nodeUse) fits(i int, d *device, seats int64) bool {
	if d.tainted || seats > d.seats {
		return false
	}
	if d.shared && u.inUse[i] {
		return u.seats[i]+seats <= d.seats
	}
	if u.inUse[i] {
		return false
	}
	return !d.exclusive || !u.held.overlaps(d.gpus)
}

func (u *nodeUse) take(i int, d *device, seats int64) {
	u.inUse[i] = true
	if d.shared {
		u.seats[i] += seats
	}
	u.busy.addAll(d.gpus)
	if d.exclusive {
		u.held.addAll(d.gpus)
	}
}

// predict places reqs on the pool as the allocator would.
func predict(ctx context.Context, celCache *cel.Cache, p *pool, a *allocated, reqs []request) outcome {
	o := outcome{predicted: true, gpus: p.gpus}
	use := newNodeUse(p, a)
	before := use.busy.clone()
	o.busy = before.count()
	inUseBefore := append([]bool(nil), use.inUse...)
	var picked []int
	for _, r := range reqs {
		mine := false
		placed := false
		for _, alt := range r.alternatives {
			matches := p.classMatches(ctx, celCache, alt.class)
			trial := use.clone()
			var got []int
			for n := int64(0); n < alt.count; n++ {
				i := firstFit(trial, p, matches, alt.seats)
				if i < 0 {
					break
				}
				trial.take(i, p.devices[i], alt.seats)
				got = append(got, i)
			}
			if anyTrue(matches) {
				mine = true
			}
			if int64(len(got)) == alt.count && len(got) > 0 {
				use = trial
				picked = append(picked, got...)
				placed = true
				break
			}
		}
		if mine && !placed {
			o.predicted = false
		}
		o.ours = o.ours || mine
	}
	o.picks = len(picked)
	for _, i := range picked {
		if p.devices[i].shared && inUseBefore[i] {
			o.joined++
		}
	}
	for _, big := range p.devices {
		if !big.exclusive || big.tainted || before.overlaps(big.gpus) {
			continue
		}
		for _, i := range picked {
			if d := p.devices[i]; big.size > d.size && big.gpus.overlaps(d.gpus) {
				o.broken++
				break
			}
		}
	}
	return o
}

// firstFit is the first device in the pool's order that the class selects
// and that has room, -1 if none.
func firstFit(u *nodeUse, p *pool, matches []bool, seats int64) int {
	for i, d := range p.devices {
		if matches[i] && u.fits(i, d, seats) {
			return i
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
// them onto 0..100. Each part is in per mille, so that a later part only
// tells apart nodes the earlier ones find equal.
const (
	permilleSpan = 1001
	packSpan     = permilleSpan * permilleSpan
	maxBroken    = 999
)

func permille(n, of int) int64 {
	if of <= 0 {
		return 0
	}
	return int64(min(n, of)) * 1000 / int64(of)
}

func (o outcome) key(policy Policy) int64 {
	if !o.ours {
		return 0
	}
	fill := permille(o.busy, o.gpus)
	join := permille(o.joined, o.picks)
	pack := fill*permilleSpan + join
	switch policy {
	case Spread:
		return (1000-fill)*permilleSpan + (1000 - join)
	case Topology:
		broken := int64(min(o.broken, maxBroken))
		if !o.predicted {
			broken = maxBroken
		}
		return (maxBroken-broken)*packSpan + pack
	default:
		return pack
	}
}
