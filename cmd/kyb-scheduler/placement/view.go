package placement

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
	draapi "k8s.io/dynamic-resource-allocation/api"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// A cycle's view of our devices' allocations, and each pool's state under
// it.
//
// The scheduler's allocated state holds the allocations in the API, those
// it has assumed after writing them, and those of pods in flight
// (reserved, not yet bound), which the DRA plugin's claim tracker adds
// (SharedDRAManager). It is gathered afresh for every pod. Between two
// pods it changes on the node the last pod went to, and on the nodes
// whose claims were freed or written meanwhile: a few nodes, where the
// score has hundreds to order and predict.
//
// So the view is read in one pass over the state, a look-up per
// allocation (the scheduler's own gathering is a pass over the same
// allocations), not a look-up per published device of every node; and a
// pool whose allocations are those of its last order keeps that order,
// and the predictions made from it, without any work of the score's. A
// pool's state is compared whole, device by device, so nothing is reused
// for allocations that only look alike.

// poolView is the allocation state of every pool of a poolSet, device by
// device, side by side.
type poolView struct {
	allocs
}

// allocs are allocations device by device: the devices in use, the seats
// their shares consume and, of a sized group, the memory and compute.
type allocs struct {
	inUse                  []bool
	seats, memory, compute []int64
}

// sub is a's devices lo..hi, sharing a's arrays.
func (a *allocs) sub(lo, hi int) allocs {
	return allocs{inUse: a.inUse[lo:hi], seats: a.seats[lo:hi], memory: a.memory[lo:hi], compute: a.compute[lo:hi]}
}

// equal says whether a and b are the same allocations.
func (a *allocs) equal(b *allocs) bool {
	return slices.Equal(a.inUse, b.inUse) && slices.Equal(a.seats, b.seats) &&
		slices.Equal(a.memory, b.memory) && slices.Equal(a.compute, b.compute)
}

// assign makes a a copy of b, in a's own buffers.
func (a *allocs) assign(b *allocs) {
	a.inUse = append(a.inUse[:0], b.inUse...)
	a.seats = append(a.seats[:0], b.seats...)
	a.memory = append(a.memory[:0], b.memory...)
	a.compute = append(a.compute[:0], b.compute...)
}

// clone is a copy of a in arrays of its own.
func (a *allocs) clone() allocs {
	return allocs{inUse: slices.Clone(a.inUse), seats: slices.Clone(a.seats), memory: slices.Clone(a.memory), compute: slices.Clone(a.compute)}
}

// reset makes a n devices without allocations, in its own buffers.
func (a *allocs) reset(n int) {
	a.inUse = resize(a.inUse, n)
	a.seats = resize(a.seats, n)
	a.memory = resize(a.memory, n)
	a.compute = resize(a.compute, n)
}

// gather reads the state's allocations of the set's devices into v, in
// v's own buffers, as the allocator reads them: a device allocated whole
// (the state keeps it by device) is in use and takes nothing more, a
// shared one included; a device with a share is in use, its seats the
// consumed capacity the state keeps by device (a share of a device that
// publishes seats consumes at least one, its request policy's minimum);
// only a shared device without seats needs the shares themselves, which
// the state keys by share. A sized group's memory and compute are what
// its shares consume, likewise kept by device; a whole allocation of one
// leaves it nothing.
//
// An allocation's kind is the device's kind when it was made, not
// necessarily as published now: a profile republished with more or fewer
// seats keeps its devices' names, so that a whole allocation can hold a
// device now shared, and shares a device now ordinary. The allocator
// gives the first no share (the device is allocated), and charges the
// counters of the second, which leaves it no room where it consumes its
// GPUs' (every profile but an overprovisioning one): both are in use
// here, whatever the slice says of the device now.
func (v *poolView) gather(ps *poolSet, state *structured.AllocatedState) {
	v.reset(len(ps.ids))
	for id, c := range state.AggregatedCapacity {
		if id.Driver != ourDriver {
			continue
		}
		i := ps.index(id)
		if i < 0 {
			continue
		}
		v.inUse[i] = true
		d := ps.devices[i]
		if q := c[seatsCapacity]; q != nil && d.shared {
			v.seats[i] = q.Value()
		}
		if d.sized != nil {
			v.memory[i] = consumedValue(c[memoryCapacity])
			v.compute[i] = consumedValue(c[computeCapacity])
		}
	}
	if ps.unseatedShares {
		for id := range state.AllocatedSharedDeviceIDs {
			if id.Driver != ourDriver {
				continue
			}
			if i := ps.index(id.GetDeviceID()); i >= 0 && ps.devices[i].shared && !ps.devices[i].seatsPublished {
				v.inUse[i] = true
			}
		}
	}
	// Last, so that a whole allocation of a shared device leaves it no
	// seat whatever its shares took.
	for id := range state.AllocatedDevices {
		if id.Driver != ourDriver {
			continue
		}
		if i := ps.index(id); i >= 0 {
			v.inUse[i] = true
			d := ps.devices[i]
			if d.shared {
				v.seats[i] = d.seats
			}
			if d.sized != nil {
				v.memory[i], v.compute[i] = d.sized.memory.value, d.sized.compute.value
			}
		}
	}
}

// consumedValue is a consumed capacity in whole units, 0 where none.
func consumedValue(q *resource.Quantity) int64 {
	if q == nil {
		return 0
	}
	return q.Value()
}

// ourDriver is the driver's name as the allocated state holds it.
var ourDriver = draapi.MakeUniqueString(driver.Name)

// parallelFrom is how many pools of a cycle must be ordered or predicted
// anew before the framework's parallelizer is worth its goroutines.
const parallelFrom = 16

// poolStates returns each pool's state under the cycle's allocations, by
// the set's pool index: the pool's last one where its allocations are
// unchanged, else one made now.
func (pl *Plugin) poolStates(ctx context.Context, ps *poolSet, state *structured.AllocatedState) []*ordered {
	v, _ := pl.views.Get().(*poolView)
	if v == nil {
		v = &poolView{}
	}
	defer pl.views.Put(v)
	v.gather(ps, state)
	out := make([]*ordered, len(ps.list))
	var changed []int
	for k, p := range ps.list {
		a := v.sub(ps.base[k], ps.base[k+1])
		if out[k] = p.lastOrder(&a); out[k] == nil {
			changed = append(changed, k)
		}
	}
	orderPool := func(j int) {
		k := changed[j]
		a := v.sub(ps.base[k], ps.base[k+1])
		s := pl.getScratch()
		out[k] = ps.list[k].reorder(&a, s)
		pl.scratch.Put(s)
	}
	if pl.parallel != nil && len(changed) > parallelFrom {
		pl.parallel.Until(ctx, len(changed), orderPool, Name)
	} else {
		for j := range changed {
			orderPool(j)
		}
	}
	return out
}

// lastOrder returns the pool's last order if it was made for these
// allocations, else nil.
func (p *pool) lastOrder(a *allocs) *ordered {
	p.orderMu.Lock()
	defer p.orderMu.Unlock()
	if o := p.last; o != nil && o.equal(a) {
		return o
	}
	return nil
}

// predictionCap bounds the predictions an order keeps: one per kind of
// pod scheduled while the node's allocations stay the same.
const predictionCap = 16

// prediction returns the outcome predicted under the order for pods whose
// requests have the key, if there is one.
func (o *ordered) prediction(key string) (outcome, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out, ok := o.predictions[key]
	return out, ok
}

func (o *ordered) keep(key string, out outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.predictions == nil || len(o.predictions) >= predictionCap {
		o.predictions = make(map[string]outcome, 1)
	}
	o.predictions[key] = out
}
