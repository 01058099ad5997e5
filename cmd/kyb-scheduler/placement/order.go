package placement

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// deviceOrder chooses the group within a node. The allocator takes the
// first device of a node's slices, in their order, that the request's
// class selects and that has room: with the published order alone (the
// smallest groups first, by GPU index), a seat on a node with a hole
// goes to the lowest free GPU whatever idle larger group it breaks, and
// a share goes to the first shared group with room rather than the one
// in use. A score ranks nodes; it cannot change that choice.
//
// kyb-scheduler's patch to the DynamicResources plugin lets a plugin
// whose PreFilter runs first leave, under DeviceOrderKey, an order for
// the cycle's allocator: KybPlacement's PreFilter writes this one, and
// the DynamicResources PreFilter hands it the slices it lists. For each
// node of ours, among the devices of each profile, it puts first the
// devices that join GPUs already in use (a share of a group in use, a MIG
// instance on a GPU already partitioned), then those that break the
// fewest idle larger groups, and last those with no room; the published
// order breaks ties, and the profiles keep their published order. Under
// spread the published order stays.
//
// Only the order within each slice changes, never a device, a slice's
// other fields or which slice holds a device, so the allocator allocates
// and checks exactly as it does on the published slices. A node's
// reordered copies are kept while its allocations stay the same, so the
// allocator's own cache of built pools keeps them too.
type deviceOrder struct {
	pl     *Plugin
	policy Policy
	// reqs are the pod's requests of our devices, for PreScore too.
	reqs []request
	// applied: the DynamicResources plugin ordered the cycle's slices. It
	// does not where its PreFilter ran before ours (a configuration that
	// does not enable KybPlacement at PreFilter first): the score then
	// predicts the published order.
	applied atomic.Bool
	// orders are the pools' orders under the cycle's allocations, as
	// handed to the allocator; PreScore predicts from them, so that a
	// node's allocations are looked up once per cycle, not twice.
	orders map[*pool]*ordered
}

var _ dynamicresources.DeviceOrder = &deviceOrder{}

// Clone returns the order itself: what it holds of the cycle (whether it
// was applied, the orders handed to the allocator) is written once, in
// the DynamicResources plugin's PreFilter, before any clone is made.
func (o *deviceOrder) Clone() fwk.StateData { return o }

// OrderDevices returns all with the slices of our nodes whose order
// changes replaced by reordered copies.
func (o *deviceOrder) OrderDevices(ctx context.Context, state *structured.AllocatedState, all []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	defer o.pl.metrics.since(stepDeviceOrder, time.Now())
	// Stored last: whoever sees it applied sees the orders.
	defer o.applied.Store(true)
	if o.policy == Spread || state == nil {
		return all
	}
	pools := o.pl.pools.update(all)
	alloc := ourAllocations(state)
	list := make([]*pool, 0, len(pools))
	for _, p := range pools {
		list = append(list, p)
	}
	orders := make([]*ordered, len(list))
	orderPool := func(i int) {
		s := o.pl.getScratch()
		orders[i] = list[i].reorder(alloc, s)
		o.pl.scratch.Put(s)
	}
	if o.pl.parallel != nil {
		o.pl.parallel.Until(ctx, len(list), orderPool, Name)
	} else {
		for i := range list {
			orderPool(i)
		}
	}
	o.orders = make(map[*pool]*ordered, len(list))
	for i, p := range list {
		o.orders[p] = orders[i]
	}
	var out []*resourceapi.ResourceSlice
	for i, s := range all {
		if s.Spec.Driver != driver.Name || s.Spec.NodeName == nil {
			continue
		}
		p := pools[*s.Spec.NodeName]
		if p == nil {
			continue
		}
		if r := o.orders[p].copies[s]; r != nil {
			if out == nil {
				out = slices.Clone(all)
			}
			out[i] = r
		}
	}
	if out == nil {
		return all
	}
	return out
}

// ordered is a pool's order under the allocations it was computed for.
type ordered struct {
	// inUse and seats: the allocations (nodeUse's) the order is for.
	inUse []bool
	seats []int64
	// order: the pool's device indices, each slice's in its new order.
	order []int
	// copies: the reordered copy of each slice whose order changed.
	copies map[*resourceapi.ResourceSlice]*resourceapi.ResourceSlice
}

// reorder returns the pool's order under a's allocations: the last one,
// where they are its allocations, else a new one.
func (p *pool) reorder(a *allocated, s *scratch) *ordered {
	s.use.reset(p, a)
	p.orderMu.Lock()
	defer p.orderMu.Unlock()
	if o := p.last; o != nil && slices.Equal(o.inUse, s.use.inUse) && slices.Equal(o.seats, s.use.seats) {
		return o
	}
	o := &ordered{inUse: slices.Clone(s.use.inUse), seats: slices.Clone(s.use.seats), order: p.preferred(&s.use, nil)}
	for _, sp := range p.spans {
		idx := o.order[sp.start:sp.end]
		if slices.IsSorted(idx) {
			continue
		}
		c := *sp.slice
		c.Spec.Devices = make([]resourceapi.Device, len(idx))
		for k, i := range idx {
			c.Spec.Devices[k] = sp.slice.Spec.Devices[i-sp.start]
		}
		if o.copies == nil {
			o.copies = map[*resourceapi.ResourceSlice]*resourceapi.ResourceSlice{}
		}
		o.copies[sp.slice] = &c
	}
	p.last = o
	return o
}

// preferred appends to buf the pool's device indices in the order the
// allocator should try them under use, slice by slice and, within a
// slice, profile by profile as published: devices with room for a seat
// first, among them those that join GPUs in use, then those that break
// the fewest idle larger groups; the published order breaks ties. A
// device never moves ahead of another profile's: the allocator evaluates
// the request's selectors on every device it tries, and a device of
// another profile is one more evaluation that cannot match.
func (p *pool) preferred(use *nodeUse, buf []int) []int {
	type rank struct {
		block  int
		full   bool
		broken int
		joined bool
	}
	ranks := make([]rank, len(p.devices))
	for i, d := range p.devices {
		ranks[i] = rank{
			block:  d.block,
			full:   !use.fits(i, d, 1),
			broken: p.breaks(i, use.busy),
			joined: d.joins(use.inUse[i], use.busy),
		}
	}
	start := len(buf)
	for i := range p.devices {
		buf = append(buf, i)
	}
	for _, sp := range p.spans {
		slices.SortStableFunc(buf[start+sp.start:start+sp.end], func(a, b int) int {
			ra, rb := ranks[a], ranks[b]
			switch {
			case ra.block != rb.block:
				return ra.block - rb.block
			case ra.full != rb.full:
				return boolOrder(ra.full)
			case ra.joined != rb.joined:
				return boolOrder(rb.joined)
			default:
				return ra.broken - rb.broken
			}
		})
	}
	return buf
}

// boolOrder sorts false before true: -1 where first is false.
func boolOrder(first bool) int {
	if first {
		return 1
	}
	return -1
}

// joins says whether taking d joins GPUs already in use, where d is in
// use (inUse) and busy are the GPUs in use: a share of a shared group in
// use, or a MIG instance on a GPU already partitioned.
func (d *device) joins(inUse bool, busy gpuSet) bool {
	return (d.shared && inUse) || (d.partial && busy.overlaps(d.gpus))
}

// breaks counts the idle larger groups device i overlaps: exclusive,
// untainted groups of more GPUs, none of them busy, that taking i would
// leave short of a whole island.
func (p *pool) breaks(i int, busy gpuSet) int {
	d := p.devices[i]
	n := 0
	for _, big := range p.devices {
		if big.exclusive && !big.tainted && big.size > d.size && big.gpus.overlaps(d.gpus) && !busy.overlaps(big.gpus) {
			n++
		}
	}
	return n
}
