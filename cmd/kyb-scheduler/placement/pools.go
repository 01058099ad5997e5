package placement

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	draapi "k8s.io/dynamic-resource-allocation/api"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// What the driver publishes (pkg/draresources, docs/design.md "The DRA
// representation"); a test keeps these equal to the driver's own.
const (
	// counterSet holds one counter per GPU, named counterPrefix+index.
	counterSet    = "gpus"
	counterPrefix = "gpu"
	// seatsCapacity is a group's seats.
	seatsCapacity resourceapi.QualifiedName = "seats"
	// gpuIndexLimit bounds the GPU indices read from a slice's counter
	// names and attributes: the driver publishes at most 32 GPUs a node
	// (pkg/planner MaxGPUs; a test keeps them equal), and a set sized by
	// an index read from the API (gpu9000000000000000 is a valid counter
	// name) would let one slice take the scheduler's memory, and the
	// device order's time (breaks.go). A larger index is no GPU of ours.
	gpuIndexLimit = 32
	// maxPoolDevices is the most devices the driver publishes in a node's
	// pool (pkg/draresources MaxPoolDevices: a profile of every group size
	// at the most seats on the most GPUs, in the per-seat layout). A node
	// that publishes more is no node of the driver's as it runs: its pool
	// is left to the allocator in its published order and scored as not
	// ours, so that the work a node can make the score do per
	// republication stays what an honest node's costs.
	maxPoolDevices = 7680
)

// device is one of our published devices, as the score needs it.
type device struct {
	// id is the device as the allocated state names it.
	id   structured.DeviceID
	name string
	// gpus are the GPUs of its group; size is how many.
	gpus gpuSet
	size int
	// seats is its "seats" capacity (1 where it publishes none);
	// seatsPublished, whether it does.
	seats          int64
	seatsPublished bool
	// shared: allowMultipleAllocations; a share takes seats.
	shared bool
	// exclusive: it consumes its GPUs' counters, so that no overlapping
	// group can be allocated while it is in use (every profile but an
	// overprovisioning one).
	exclusive bool
	// consumes are the counters it consumes, of every set, by the pool's
	// counter index: what the allocator checks, so that a MIG instance
	// takes its memory slices and its share of the GPU's counter, not the
	// whole GPU.
	consumes []consumption
	// partial: it takes part of a GPU (a MIG instance: less than the GPU's
	// counter holds), so another device can join it on that GPU.
	partial bool
	// sized: a sized group's memory and compute (sizes.go), nil for any
	// other device.
	sized *sizedCapacities
	// tainted with NoSchedule or NoExecute: the allocator takes it only
	// for a request that tolerates the taint, which the score does not
	// predict, so it counts as unavailable.
	tainted bool
	// api is the device as published, for the classes' selectors.
	api *resourceapi.Device
	// block numbers the runs of devices of one profile in the published
	// order, within the pool: the device order moves a device within its
	// block only (order.go).
	block int
}

// pool is the node's pool of our driver: its devices in the order the
// allocator tries them (first fit), and which devices each DeviceClass
// selects, computed once per version of the slices and of the class.
type pool struct {
	node string
	// slices are the objects parsed. The slice tracker hands out the same
	// objects until a slice changes, or a DeviceTaintRule does (a newly
	// patched copy): new objects are parsed again.
	slices []*resourceapi.ResourceSlice
	// listed are the node's slices as last listed, older generations
	// included, in the listing's order, to tell at a glance that nothing
	// changed.
	listed  []*resourceapi.ResourceSlice
	gpus    int
	devices []*device

	// capacity is each counter's value, by the index devices consume it
	// by.
	capacity []int64

	mu      sync.RWMutex
	matches map[string][]bool

	// spans: where each slice's devices are in devices, for the device
	// order, which reorders within a slice only.
	spans []span
	// identity is the published order, 0..len(devices).
	identity []int
	orderMu  sync.Mutex
	// last is the device order for the allocations last seen.
	last *ordered
}

// span is one slice's devices, devices[start:end].
type span struct {
	slice      *resourceapi.ResourceSlice
	start, end int
}

// published is the pool's devices in the order the slices publish them.
func (p *pool) published() []int { return p.identity }

// consumption is an amount of one of the pool's counters.
type consumption struct {
	counter int
	amount  int64
}

// poolCache keeps the parsed pools from one scheduling cycle to the next:
// a node's slices change when its GPUs' health does, not when claims come
// and go, so parsing them again for every pod would be wasted work.
type poolCache struct {
	mu  sync.Mutex
	set *poolSet
	// listed: every slice of the last listing, of any driver.
	listed map[*resourceapi.ResourceSlice]struct{}
}

// poolSet is one version of the cluster's pools of our driver, and where
// each of their devices is in a cycle's view of the allocations (view.go).
type poolSet struct {
	// list: the pools, each node's once; slot names a node's index in it.
	list []*pool
	slot map[string]int
	// base: list[k]'s devices are base[k]..base[k+1] of a view.
	base []int
	// byPool: the index in list of the node whose pool has the name the
	// allocated state names it by (a node's pool is one of ours).
	byPool map[draapi.UniqueString]int
	// ids are the devices' IDs, side by side, for index's scan;
	// devices, the devices by the same index.
	ids     []structured.DeviceID
	devices []*device
	// large: the devices of pools of more than scannedPool, by ID.
	large map[structured.DeviceID]int
	// spanOf: where each slice the set was made of is, for the device
	// order's copies.
	spanOf map[*resourceapi.ResourceSlice]spanRef
	// unseatedShares: some shared device publishes no seats, so that only
	// the state's shares tell whether it is in use.
	unseatedShares bool
	// larger: the larger group sizes (bits of largerSizes) some pool has
	// exclusive groups of, for the bound on a node's word (trust.go).
	larger uint8
	// skipped are the slices of the nodes whose slices make no pool of
	// ours (incomplete, larger than the driver publishes, or with a device
	// that names no GPU: trust.go), as listed,
	// so that they are judged once per version.
	skipped map[string][]*resourceapi.ResourceSlice
}

// pool returns the node's pool, nil if it has none of ours.
func (ps *poolSet) pool(node string) *pool {
	if k, ok := ps.slot[node]; ok {
		return ps.list[k]
	}
	return nil
}

// scannedPool is the most devices of a pool index scans for an ID.
const scannedPool = 64

// spanRef names a slice's span: spans[span] of list[pool].
type spanRef struct{ pool, span int }

func newPoolSet(pools map[string]*pool) *poolSet {
	ps := &poolSet{
		slot:   make(map[string]int, len(pools)),
		byPool: make(map[draapi.UniqueString]int, len(pools)),
		spanOf: make(map[*resourceapi.ResourceSlice]spanRef, len(pools)),
		large:  map[structured.DeviceID]int{},
	}
	for _, p := range pools {
		k := len(ps.list)
		ps.slot[p.node] = k
		ps.list = append(ps.list, p)
		ps.base = append(ps.base, len(ps.ids))
		large := len(p.devices) > scannedPool
		for _, d := range p.devices {
			ps.byPool[d.id.Pool] = k
			if large {
				ps.large[d.id] = len(ps.ids)
			}
			ps.ids = append(ps.ids, d.id)
			ps.devices = append(ps.devices, d)
			ps.unseatedShares = ps.unseatedShares || (d.shared && !d.seatsPublished)
			if d.exclusive {
				ps.larger |= sizeBits(d.size)
			}
		}
		for j, sp := range p.spans {
			ps.spanOf[sp.slice] = spanRef{pool: k, span: j}
		}
	}
	ps.base = append(ps.base, len(ps.ids))
	return ps
}

// index is the device's index in a view, -1 if the set has none by that
// ID. A node's pool has a few dozen devices: a scan of its IDs, side by
// side, is quicker than a map of every device of the cluster. Pools of
// more (seats of the per-seat layout) are looked up in a map of their
// own, so that a view's pass stays a look-up per allocation.
func (ps *poolSet) index(id structured.DeviceID) int {
	k, ok := ps.byPool[id.Pool]
	if !ok {
		return -1
	}
	if ps.base[k+1]-ps.base[k] > scannedPool {
		if i, ok := ps.large[id]; ok {
			return i
		}
		return -1
	}
	for i := ps.base[k]; i < ps.base[k+1]; i++ {
		if ps.ids[i] == id {
			return i
		}
	}
	return -1
}

// update returns the pools of our driver among slices, parsing only the
// pools whose slices changed since the last call.
func (c *poolCache) update(ctx context.Context, all []*resourceapi.ResourceSlice) *poolSet {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unchanged(all) {
		// The common case, every pod: no slice changed anywhere.
		return c.set
	}
	byNode := map[string][]*resourceapi.ResourceSlice{}
	for _, s := range all {
		if s.Spec.Driver != driver.Name || s.Spec.NodeName == nil {
			continue
		}
		byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], s)
	}
	next := make(map[string]*pool, len(byNode))
	skipped := map[string][]*resourceapi.ResourceSlice{}
	for node, ss := range byNode {
		var p *pool
		if c.set != nil {
			if p = c.set.pool(node); p != nil && sameObjects(p.listed, ss) {
				// Most nodes when one changes: nothing of theirs did.
				next[node] = p
				continue
			}
			if sameObjects(c.set.skipped[node], ss) {
				skipped[node] = ss
				continue
			}
		}
		listed := ss
		ss = completePools(ss)
		if n := deviceCount(ss); len(ss) == 0 || n > maxPoolDevices {
			if n > maxPoolDevices {
				klog.FromContext(ctx).V(2).Info("Node publishes more devices than the driver does: its pool is left to the allocator unordered and unscored", "node", node, "devices", n, "limit", maxPoolDevices)
			}
			skipped[node] = listed
			continue
		}
		if p == nil || !slices.Equal(p.slices, ss) {
			p = parsePool(node, ss)
		}
		if d := p.unplaced(); d != nil {
			klog.FromContext(ctx).V(2).Info("Node publishes a device that names no GPU: its pool is left to the allocator unordered and unscored", "node", node, "device", d.name)
			skipped[node] = listed
			continue
		}
		p.listed = listed
		next[node] = p
	}
	c.set = newPoolSet(next)
	c.set.skipped = skipped
	c.listed = make(map[*resourceapi.ResourceSlice]struct{}, len(all))
	for _, s := range all {
		c.listed[s] = struct{}{}
	}
	return c.set
}

// unchanged says whether all holds the very objects of the last listing:
// the slice tracker hands out the same object until its slice changes,
// so a look-up per slice tells, where comparing pools needs a map of
// every node.
func (c *poolCache) unchanged(all []*resourceapi.ResourceSlice) bool {
	if c.set == nil || len(all) != len(c.listed) {
		return false
	}
	for _, s := range all {
		if _, ok := c.listed[s]; !ok {
			return false
		}
	}
	return true
}

// sameObjects says whether a and b hold the same objects, in any order
// (a lister's order is its map's). A node has a few slices, but may
// publish many.
func sameObjects(a, b []*resourceapi.ResourceSlice) bool {
	if len(a) != len(b) || a == nil {
		return false
	}
	if len(a) <= 16 {
		for _, s := range b {
			if !slices.Contains(a, s) {
				return false
			}
		}
		return true
	}
	in := make(map[*resourceapi.ResourceSlice]struct{}, len(a))
	for _, s := range a {
		in[s] = struct{}{}
	}
	for _, s := range b {
		if _, ok := in[s]; !ok {
			return false
		}
	}
	return true
}

// completePools keeps, of each pool among one node's slices (in the
// listing's order), the slices of its newest generation where that
// generation is complete, sorted by name, as the allocator does
// (GatherPools in k8s.io/dynamic-resource-allocation/structured): a
// generation is complete once spec.pool.resourceSliceCount of its slices
// are listed; while a pool is republished neither an incomplete newest
// generation nor the older one gives a device.
//
// The allocator takes the count from the generation's first slice in its
// listing. Slices of one generation that disagree on it are no pool the
// driver publishes, and the score, which cannot see the allocator's
// listing order, takes none of them.
//
// The allocator's order between a pool's slices is its listing's, which
// the score cannot see either; our pools hold one slice of devices up to
// 64 groups, so the order within it is what matters.
func completePools(ss []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	type generation struct {
		number int64
		// count: the slices' resourceSliceCount, -1 where they disagree;
		// listed, how many are.
		count, listed int64
	}
	newest := map[string]*generation{}
	for _, s := range ss {
		pool := s.Spec.Pool
		g := newest[pool.Name]
		switch {
		case g == nil || pool.Generation > g.number:
			newest[pool.Name] = &generation{number: pool.Generation, count: pool.ResourceSliceCount, listed: 1}
		case pool.Generation == g.number:
			g.listed++
			if pool.ResourceSliceCount != g.count {
				g.count = -1
			}
		}
	}
	out := ss[:0:0]
	for _, s := range ss {
		if g := newest[s.Spec.Pool.Name]; s.Spec.Pool.Generation == g.number && g.listed == g.count {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *resourceapi.ResourceSlice) int {
		return cmp.Or(cmp.Compare(a.Spec.Pool.Name, b.Spec.Pool.Name), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// deviceCount is how many devices the slices publish.
func deviceCount(ss []*resourceapi.ResourceSlice) int {
	n := 0
	for _, s := range ss {
		n += len(s.Spec.Devices)
	}
	return n
}

func parsePool(node string, ss []*resourceapi.ResourceSlice) *pool {
	p := &pool{node: node, slices: ss, matches: map[string][]bool{}}
	counters := 0
	index := map[counterID]int{}
	for _, s := range ss {
		for _, cs := range s.Spec.SharedCounters {
			if cs.Name == counterSet {
				counters = max(counters, len(cs.Counters))
			}
			for name, c := range cs.Counters {
				index[counterID{pool: s.Spec.Pool.Name, set: cs.Name, name: name}] = len(p.capacity)
				p.capacity = append(p.capacity, c.Value.Value())
			}
		}
	}
	block, last := -1, ""
	for _, s := range ss {
		sp := span{slice: s, start: len(p.devices)}
		for i := range s.Spec.Devices {
			d := parseDevice(&s.Spec.Devices[i])
			if k := profileOf(d); k != last || i == 0 {
				block, last = block+1, k
			}
			d.block = block
			d.id = structured.MakeDeviceID(driver.Name, s.Spec.Pool.Name, d.name)
			p.consumption(d, s.Spec.Pool.Name, index)
			p.identity = append(p.identity, len(p.devices))
			p.devices = append(p.devices, d)
			p.gpus = max(p.gpus, d.gpus.bound())
		}
		sp.end = len(p.devices)
		p.spans = append(p.spans, sp)
	}
	p.gpus = max(p.gpus, counters)
	return p
}

// profileOf names d's profile: its profile attribute, else its size and
// whether it is part of a GPU (the per-seat layout publishes none).
func profileOf(d *device) string {
	if a, ok := d.api.Attributes[resourceapi.QualifiedName(v1alpha1.AttrProfile)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return fmt.Sprintf("%d/%t", d.size, d.partial)
}

// counterID names a counter as the allocator keeps it: by pool, for a
// counter set's name is the pool's own, and a node's slices may publish
// two pools with sets of one name (a pool renamed: the old one until it
// is deleted), whose counters the allocator keeps apart.
type counterID struct{ pool, set, name string }

// consumption reads what d, of the named pool, consumes of the node's
// counters. A counter no set of the pool holds has no room: the allocator
// takes no such device.
func (p *pool) consumption(d *device, pool string, index map[counterID]int) {
	for _, cc := range d.api.ConsumesCounters {
		for name, c := range cc.Counters {
			id := counterID{pool: pool, set: cc.CounterSet, name: name}
			k, ok := index[id]
			if !ok {
				k = len(p.capacity)
				index[id] = k
				p.capacity = append(p.capacity, 0)
			}
			amount := c.Value.Value()
			d.consumes = append(d.consumes, consumption{counter: k, amount: amount})
			if cc.CounterSet == counterSet && strings.HasPrefix(name, counterPrefix) && amount < p.capacity[k] {
				d.partial = true
			}
		}
	}
}

// parseDevice reads a device's GPUs from the counters it consumes (the
// counter set's "gpuN"), else from its gpuIndices attribute ("0,1"),
// which the per-seat layout, without counters, publishes.
func parseDevice(api *resourceapi.Device) *device {
	d := &device{name: api.Name, api: api, seats: 1, shared: api.AllowMultipleAllocations != nil && *api.AllowMultipleAllocations}
	for _, cc := range api.ConsumesCounters {
		if cc.CounterSet != counterSet {
			continue
		}
		for name := range cc.Counters {
			if i, err := strconv.Atoi(strings.TrimPrefix(name, counterPrefix)); err == nil && strings.HasPrefix(name, counterPrefix) && i >= 0 && i < gpuIndexLimit {
				d.gpus.add(i)
				d.exclusive = true
			}
		}
	}
	if !d.exclusive {
		if a, ok := api.Attributes[resourceapi.QualifiedName(v1alpha1.AttrGPUIndices)]; ok && a.StringValue != nil {
			for _, f := range strings.Split(*a.StringValue, ",") {
				if i, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && i >= 0 && i < gpuIndexLimit {
					d.gpus.add(i)
				}
			}
		}
	}
	d.size = d.gpus.count()
	if c, ok := api.Capacity[seatsCapacity]; ok && c.Value.Value() > 0 {
		d.seats = c.Value.Value()
		d.seatsPublished = true
	}
	d.sized = parseSized(api)
	for _, t := range api.Taints {
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			d.tainted = true
		}
	}
	return d
}

// classMatches says which of the pool's devices a DeviceClass selects,
// evaluating its CEL selectors once per version of the class and the
// pool (key: classKey). A selector that does not compile or fails
// selects nothing here; the allocator reports it to the pod.
func (p *pool) classMatches(ctx context.Context, celCache *cel.Cache, class *resourceapi.DeviceClass, key string) []bool {
	// Nodes are predicted in parallel, and every one but the first of a
	// version reads.
	p.mu.RLock()
	m, ok := p.matches[key]
	p.mu.RUnlock()
	if ok {
		return m
	}
	m = make([]bool, len(p.devices))
	for i, d := range p.devices {
		m[i] = selects(ctx, celCache, class, d.api)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.matches) > 64 {
		// Versions of classes long gone.
		clear(p.matches)
	}
	p.matches[key] = m
	return m
}

// classKey names a version of a DeviceClass, for the pools' caches of
// what it selects.
func classKey(class *resourceapi.DeviceClass) string {
	return string(class.UID) + "/" + class.ResourceVersion
}

func selects(ctx context.Context, celCache *cel.Cache, class *resourceapi.DeviceClass, api *resourceapi.Device) bool {
	for _, sel := range class.Spec.Selectors {
		if sel.CEL == nil {
			continue
		}
		expr := celCache.GetOrCompile(sel.CEL.Expression)
		if expr.Error != nil {
			klog.FromContext(ctx).V(4).Info("DeviceClass selector does not compile", "deviceClass", klog.KObj(class), "err", expr.Error)
			return false
		}
		ok, _, err := expr.DeviceMatches(ctx, cel.Device{Driver: driver.Name, AllowMultipleAllocations: api.AllowMultipleAllocations, Attributes: api.Attributes, Capacity: api.Capacity})
		if err != nil || !ok {
			return false
		}
	}
	return true
}
