package placement

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
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
	// set and states are the pools the allocator got, and their states
	// under the cycle's allocations (by the set's pool index), as handed
	// to the allocator: PreScore predicts from them, so that the cycle's
	// allocations are read once, not twice.
	set    *poolSet
	states []*ordered
}

var _ dynamicresources.DeviceOrder = &deviceOrder{}

// Clone returns the order itself: what it holds of the cycle (whether it
// was applied, the states handed to the allocator) is written once, in
// the DynamicResources plugin's PreFilter, before any clone is made.
func (o *deviceOrder) Clone() fwk.StateData { return o }

// OrderDevices returns all with the slices of our nodes whose order
// changes replaced by reordered copies. Under spread it returns all as
// it is, and keeps the pools' states for PreScore.
func (o *deviceOrder) OrderDevices(ctx context.Context, state *structured.AllocatedState, all []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	defer o.pl.metrics.since(stepDeviceOrder, time.Now())
	// Stored last: whoever sees it applied sees the states.
	defer o.applied.Store(true)
	if state == nil {
		return all
	}
	o.set = o.pl.pools.update(ctx, all)
	o.states = o.pl.poolStates(ctx, o.set, state)
	if o.policy == Spread {
		return all
	}
	if !slices.ContainsFunc(o.states, func(st *ordered) bool { return st.copies != nil }) {
		return all
	}
	out := slices.Clone(all)
	for i, s := range all {
		if r, ok := o.set.spanOf[s]; ok {
			if c := o.states[r.pool].copies; len(c) > r.span && c[r.span] != nil {
				out[i] = c[r.span]
			}
		}
	}
	return out
}

// ordered is a pool's state under the allocations it was computed for:
// its device order, and the predictions made from it.
type ordered struct {
	// allocs: the allocations the order is for.
	allocs
	// order: the pool's device indices, each slice's in its new order.
	order []int
	// copies: the reordered copy of each slice whose order changed, by
	// the pool's span; nil where none did.
	copies []*resourceapi.ResourceSlice

	mu sync.Mutex
	// predictions: outcomes by predictionKey, while the allocations last.
	predictions map[string]outcome
}

// reorder makes the pool's state under the allocations a (the pool's
// part of a poolView), and keeps it as the pool's last.
func (p *pool) reorder(a *allocs, s *scratch) *ordered {
	o := &ordered{allocs: a.clone()}
	s.use.restore(p, o)
	o.order = p.preferred(&s.use, s)
	for j, sp := range p.spans {
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
			o.copies = make([]*resourceapi.ResourceSlice, len(p.spans))
		}
		o.copies[j] = &c
	}
	p.orderMu.Lock()
	p.last = o
	p.orderMu.Unlock()
	return o
}

// preferred returns the pool's device indices in the order the allocator
// should try them under use, slice by slice and, within a slice, profile
// by profile as published: devices with room for a seat first, among
// them those that join GPUs in use, then those that break the fewest
// idle larger groups (breaks.go), then sized groups by the memory they
// have left, least first, and the compute; the published order breaks
// ties. The allocator takes the first sized group with room for a claim:
// in this order, the one the claim leaves the least memory on (best
// fit), whatever its size. A device never moves ahead of another
// profile's: the allocator evaluates the request's selectors on every
// device it tries, and a device of another profile is one more
// evaluation that cannot match.
func (p *pool) preferred(use *nodeUse, s *scratch) []int {
	type rank struct {
		block           int
		full            bool
		broken          int
		joined          bool
		memory, compute int64
	}
	s.broken = s.breaks.count(p, use.busy, s.broken)
	ranks := make([]rank, len(p.devices))
	for i, d := range p.devices {
		ranks[i] = rank{
			block:  d.block,
			full:   !use.fits(i, d, &smallest),
			broken: s.broken[i],
			joined: d.joins(use.inUse[i], use.busy),
		}
		if d.sized != nil {
			ranks[i].memory = d.sized.memory.value - use.memory[i]
			ranks[i].compute = d.sized.compute.value - use.compute[i]
		}
	}
	buf := slices.Clone(p.identity)
	for _, sp := range p.spans {
		slices.SortStableFunc(buf[sp.start:sp.end], func(a, b int) int {
			ra, rb := ranks[a], ranks[b]
			switch {
			case ra.block != rb.block:
				return ra.block - rb.block
			case ra.full != rb.full:
				return boolOrder(ra.full)
			case ra.joined != rb.joined:
				return boolOrder(rb.joined)
			case ra.broken != rb.broken:
				return ra.broken - rb.broken
			default:
				return cmp.Or(cmp.Compare(ra.memory, rb.memory), cmp.Compare(ra.compute, rb.compute))
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
