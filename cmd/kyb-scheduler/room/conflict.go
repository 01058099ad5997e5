package room

import (
	"cmp"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
)

// holding is an allocated claim that releasing units frees: every pod it
// is reserved for belongs to one of them, and all of those must go.
type holding struct {
	claim *resourceapi.ResourceClaim
	units []int
}

type share struct {
	holding  int
	consumed map[resourceapi.QualifiedName]resource.Quantity
}

// usage is who holds what of a node's devices: the claims of the units
// (holdings), and, from the allocated state, how much is held in all,
// staying claims and claims in flight included.
type usage struct {
	inv      *inventory
	state    *structured.AllocatedState
	holdings []holding
	// whole are the holdings that hold a device whole, shares those with
	// a share of it, by device.
	whole  map[structured.DeviceID][]int
	shares map[structured.DeviceID][]share
	// stateShares counts the shares of each of the node's devices in the
	// allocated state.
	stateShares map[structured.DeviceID]int
}

// newUsage finds the units' claims on the node. A claim that a pod of no
// unit also uses is not a holding: releasing units never frees it.
func newUsage(dra fwk.SharedDRAManager, state *structured.AllocatedState, inv *inventory, units []Unit) *usage {
	u := &usage{
		inv: inv, state: state,
		whole: map[structured.DeviceID][]int{}, shares: map[structured.DeviceID][]share{},
		stateShares: map[structured.DeviceID]int{},
	}
	unitOf := map[types.UID]int{}
	for i, unit := range units {
		for _, p := range unit.Pods {
			unitOf[p.UID] = i
		}
	}
	seen := sets.New[types.UID]()
	for _, unit := range units {
		for _, p := range unit.Pods {
			for _, claim := range podClaims(dra, p) {
				if seen.Has(claim.UID) || !onlyUsedBy(claim, unitOf) {
					continue
				}
				seen.Insert(claim.UID)
				h := holding{claim: claim}
				for _, r := range claim.Status.ReservedFor {
					if i, ok := unitOf[r.UID]; ok && !slices.Contains(h.units, i) {
						h.units = append(h.units, i)
					}
				}
				u.add(h)
			}
		}
	}
	for id := range state.AllocatedSharedDeviceIDs {
		device := id.GetDeviceID()
		if _, ok := inv.devices[device]; ok {
			u.stateShares[device]++
		}
	}
	return u
}

func (u *usage) add(h holding) {
	i := len(u.holdings)
	u.holdings = append(u.holdings, h)
	forEachDevice(h.claim.Status.Allocation.Devices.Results,
		func(id structured.DeviceID) { u.whole[id] = append(u.whole[id], i) },
		func(id structured.SharedDeviceID, _ structured.DeviceConsumedCapacity) {
			device := id.GetDeviceID()
			u.shares[device] = append(u.shares[device], share{holding: i, consumed: consumedBy(h.claim, id)})
		})
}

// consumedBy is the capacity a claim's share consumes.
func consumedBy(claim *resourceapi.ResourceClaim, id structured.SharedDeviceID) map[resourceapi.QualifiedName]resource.Quantity {
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.ShareID != nil && structured.MakeSharedDeviceID(structured.MakeDeviceID(r.Driver, r.Pool, r.Device), r.ShareID) == id {
			return r.ConsumedCapacity
		}
	}
	return nil
}

// charged reports whether a device consumes its counters once the
// released holdings are gone: it is held whole by a claim that stays, or
// shared by one.
func (u *usage) charged(id structured.DeviceID, released sets.Set[int]) bool {
	if u.state.AllocatedDevices.Has(id) {
		whole := u.whole[id]
		if len(whole) == 0 {
			return true
		}
		for _, h := range whole {
			if !released.Has(h) {
				return true
			}
		}
	}
	gone := 0
	for _, s := range u.shares[id] {
		if released.Has(s.holding) {
			gone++
		}
	}
	return u.stateShares[id] > gone
}

// available is what is left of a counter once the released holdings are
// gone.
func (u *usage) available(key counterKey, released sets.Set[int]) resource.Quantity {
	left := u.inv.counters[key].DeepCopy()
	for id, d := range u.inv.devices {
		if !u.charged(id, released) {
			continue
		}
		for _, c := range d.consumes {
			if c.key == key {
				left.Sub(c.amount)
			}
		}
	}
	return left
}

// conflict is what an allocation of the pod's claims, found with the
// allowed holdings released, takes from the holdings: those on the
// devices it holds whole, enough shares of each device it shares for its
// capacity, and enough of the devices that consume the counters it needs.
// Among shares and devices it releases the largest, then the cheapest
// by cost. The result is what the allocation's own devices need; the
// allocator, asked again with exactly those released, has the last word.
func (u *usage) conflict(alloc []resourceapi.AllocationResult, allowed func(h int) bool, costOf func(hs []int) cost) sets.Set[int] {
	released := sets.New[int]()
	type take struct {
		whole    bool
		consumed map[resourceapi.QualifiedName]resource.Quantity
	}
	takes := map[structured.DeviceID]*take{}
	var order []structured.DeviceID
	for i := range alloc {
		forEachDevice(alloc[i].Devices.Results,
			func(id structured.DeviceID) {
				if takes[id] == nil {
					takes[id], order = &take{consumed: map[resourceapi.QualifiedName]resource.Quantity{}}, append(order, id)
				}
				takes[id].whole = true
			},
			func(id structured.SharedDeviceID, c structured.DeviceConsumedCapacity) {
				device := id.GetDeviceID()
				if takes[device] == nil {
					takes[device], order = &take{consumed: map[resourceapi.QualifiedName]resource.Quantity{}}, append(order, device)
				}
				for name, q := range c.ConsumedCapacity {
					sum := takes[device].consumed[name]
					sum.Add(*q)
					takes[device].consumed[name] = sum
				}
			})
	}
	need := map[counterKey]resource.Quantity{}
	needCounters := func(d *deviceInfo) {
		for _, c := range d.consumes {
			sum := need[c.key]
			sum.Add(c.amount)
			need[c.key] = sum
		}
	}
	for _, id := range order {
		t, d := takes[id], u.inv.devices[id]
		if d == nil {
			continue
		}
		if t.whole {
			for _, h := range u.whole[id] {
				if allowed(h) {
					released.Insert(h)
				}
			}
			for _, s := range u.shares[id] {
				if allowed(s.holding) {
					released.Insert(s.holding)
				}
			}
			needCounters(d)
			continue
		}
		wasCharged := u.charged(id, released)
		for name, want := range t.consumed {
			free := d.capacity[name].DeepCopy()
			if used, ok := u.state.AggregatedCapacity[id][name]; ok {
				free.Sub(*used)
			}
			var candidates []share
			for _, s := range u.shares[id] {
				if !allowed(s.holding) {
					continue
				}
				if released.Has(s.holding) {
					free.Add(s.consumed[name])
					continue
				}
				candidates = append(candidates, s)
			}
			slices.SortStableFunc(candidates, func(a, b share) int {
				qa, qb := a.consumed[name], b.consumed[name]
				if c := qb.Cmp(qa); c != 0 {
					return c
				}
				return costOf([]int{a.holding}).compare(costOf([]int{b.holding}))
			})
			for _, s := range candidates {
				if free.Cmp(want) >= 0 {
					break
				}
				released.Insert(s.holding)
				free.Add(s.consumed[name])
			}
		}
		if !wasCharged {
			needCounters(d)
		}
	}
	keys := make([]counterKey, 0, len(need))
	for k := range need {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b counterKey) int {
		return cmp.Or(cmp.Compare(a.driver, b.driver), cmp.Compare(a.pool, b.pool), cmp.Compare(a.set, b.set), cmp.Compare(a.counter, b.counter))
	})
	for _, key := range keys {
		want := need[key]
		avail := u.available(key, released)
		if avail.Cmp(want) >= 0 {
			continue
		}
		// Devices that hold the counter, not the allocation's own, and
		// whose every holder may go.
		type candidate struct {
			holdings []int
			amount   resource.Quantity
			cost     cost
		}
		var candidates []candidate
		for id, d := range u.inv.devices {
			if takes[id] != nil || !u.charged(id, released) {
				continue
			}
			var amount resource.Quantity
			for _, c := range d.consumes {
				if c.key == key {
					amount.Add(c.amount)
				}
			}
			if amount.IsZero() {
				continue
			}
			hs, ok := u.holders(id, released, allowed)
			if !ok {
				continue
			}
			candidates = append(candidates, candidate{holdings: hs, amount: amount, cost: costOf(hs)})
		}
		slices.SortStableFunc(candidates, func(a, b candidate) int {
			return cmp.Or(a.cost.compare(b.cost), b.amount.Cmp(a.amount), slices.Compare(a.holdings, b.holdings))
		})
		for _, c := range candidates {
			if avail.Cmp(want) >= 0 {
				break
			}
			released.Insert(c.holdings...)
			avail.Add(c.amount)
		}
	}
	return released
}

// holders are the holdings still to release for a device to hold nothing;
// false where a claim that stays holds it.
func (u *usage) holders(id structured.DeviceID, released sets.Set[int], allowed func(int) bool) ([]int, bool) {
	var out []int
	shares := 0
	for _, h := range u.whole[id] {
		if !allowed(h) {
			return nil, false
		}
		if !released.Has(h) {
			out = append(out, h)
		}
	}
	if u.state.AllocatedDevices.Has(id) && len(u.whole[id]) == 0 {
		return nil, false
	}
	for _, s := range u.shares[id] {
		if !allowed(s.holding) {
			return nil, false
		}
		shares++
		if !released.Has(s.holding) {
			out = append(out, s.holding)
		}
	}
	if u.stateShares[id] > shares {
		return nil, false
	}
	slices.Sort(out)
	return slices.Compact(out), true
}

// unitsOf are the units the holdings belong to.
func (u *usage) unitsOf(hs sets.Set[int]) []int {
	set := sets.New[int]()
	for h := range hs {
		set.Insert(u.holdings[h].units...)
	}
	return sets.List(set)
}
