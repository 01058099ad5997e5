package room

import (
	"context"
	"maps"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/utils/ptr"
)

// changes are the pods that left or joined nodes within a pod's cycle,
// as the DynamicResources plugin's Filter is to see them: the allocated
// state its PreFilter gathered, less the devices of the claims that only
// removed pods use, plus the devices kept for nominated pods. It is the
// cycle's dynamicresources.AllocatedStateOverride. A value is never
// changed once written to a cycle state (clones share it): RemovePod and
// AddPod write a new one. The state is computed on first use per node,
// so that a dry run that removes several pods builds it once, from the
// node's part of the gathered state (scope).
type changes struct {
	base *structured.AllocatedState
	dra  fwk.SharedDRAManager
	// removed are the pods that left, by UID.
	removed map[types.UID]*v1.Pod
	// added are the allocations kept for nominated pods, by pod UID.
	added map[types.UID][]resourceapi.AllocationResult
	// record, where set, is told what Filter allocated; so is
	// allocated.
	record    *allocationRecord
	allocated func(node string, results []resourceapi.AllocationResult)

	// scope, the cycle's, has the state by node; nil: the whole state.
	scope *scope

	mu     sync.Mutex
	byNode map[string]*structured.AllocatedState
}

var _ dynamicresources.AllocatedStateOverride = &changes{}

// Clone returns the changes themselves: they are never modified.
func (c *changes) Clone() fwk.StateData { return c }

// Additive reports that no pod left: the state holds every device the
// gathered one holds.
func (c *changes) Additive() bool { return len(c.removed) == 0 }

// Allocated passes Filter's allocation on to the record.
func (c *changes) Allocated(node string, results []resourceapi.AllocationResult) {
	if c.record != nil {
		c.record.set(node, results)
	}
	if c.allocated != nil {
		c.allocated(node, results)
	}
}

// AllocatedState is the gathered state with the changes applied, as the
// node's allocator reads it.
func (c *changes) AllocatedState(_ context.Context, node *v1.Node) (*structured.AllocatedState, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.byNode[node.Name]; ok {
		return st, nil
	}
	base := c.base
	if c.scope != nil {
		base = c.scope.forNode(c.base, node.Name)
	}
	st := c.apply(base)
	if c.byNode == nil {
		c.byNode = map[string]*structured.AllocatedState{}
	}
	c.byNode[node.Name] = st
	return st, nil
}

func (c *changes) apply(base *structured.AllocatedState) *structured.AllocatedState {
	out := &structured.AllocatedState{
		AllocatedDevices:         base.AllocatedDevices.Clone(),
		AllocatedSharedDeviceIDs: base.AllocatedSharedDeviceIDs.Clone(),
		// Entries are cloned where they change.
		AggregatedCapacity: maps.Clone(base.AggregatedCapacity),
	}
	for _, claim := range releasedClaims(c.dra, c.removed) {
		forEachDevice(claim.Status.Allocation.Devices.Results,
			func(id structured.DeviceID) { out.AllocatedDevices.Delete(id) },
			func(id structured.SharedDeviceID, consumed structured.DeviceConsumedCapacity) {
				out.AllocatedSharedDeviceIDs.Delete(id)
				if capacity, ok := out.AggregatedCapacity[consumed.DeviceID]; ok && consumed.ConsumedCapacity != nil {
					capacity = capacity.Clone()
					capacity.Sub(consumed.ConsumedCapacity)
					if capacity.Empty() {
						delete(out.AggregatedCapacity, consumed.DeviceID)
					} else {
						out.AggregatedCapacity[consumed.DeviceID] = capacity
					}
				}
			})
	}
	for _, results := range c.added {
		for i := range results {
			forEachDevice(results[i].Devices.Results,
				func(id structured.DeviceID) { out.AllocatedDevices.Insert(id) },
				func(id structured.SharedDeviceID, consumed structured.DeviceConsumedCapacity) {
					// Share IDs are unique per allocation: one the state
					// holds is counted already (an allocation in flight).
					if out.AllocatedSharedDeviceIDs.Has(id) {
						return
					}
					out.AllocatedSharedDeviceIDs.Insert(id)
					if consumed.ConsumedCapacity == nil {
						return
					}
					capacity := structured.ConsumedCapacity{}
					if prev, ok := out.AggregatedCapacity[consumed.DeviceID]; ok {
						capacity = prev.Clone()
					}
					capacity.Add(consumed.ConsumedCapacity)
					out.AggregatedCapacity[consumed.DeviceID] = capacity
				})
		}
	}
	return out
}

// without returns the changes with pod removed from its node.
func (c *changes) without(pod *v1.Pod) *changes {
	out := c.copy()
	out.removed[pod.UID] = pod
	return out
}

// with returns the changes with pod back on its node, where it had been
// removed, or with the devices kept for it, where it joins a node.
func (c *changes) with(pod *v1.Pod, kept []resourceapi.AllocationResult) *changes {
	out := c.copy()
	if _, ok := out.removed[pod.UID]; ok {
		delete(out.removed, pod.UID)
		return out
	}
	out.added[pod.UID] = kept
	return out
}

// recording returns the changes telling r what Filter allocates.
func (c *changes) recording(r *allocationRecord) *changes {
	out := c.copy()
	out.record = r
	return out
}

func (c *changes) copy() *changes {
	return &changes{
		base: c.base, dra: c.dra, record: c.record, allocated: c.allocated, scope: c.scope,
		removed: maps.Clone(c.removed), added: maps.Clone(c.added),
	}
}

// newChanges are no changes to the allocated state that the
// DynamicResources plugin's PreFilter gathered for the cycle; nil where it
// gathered none (the pod has no claim to allocate).
func newChanges(cs fwk.CycleState, dra fwk.SharedDRAManager) *changes {
	if c := readChanges(cs); c != nil {
		return c
	}
	d, err := cs.Read(dynamicresources.AllocatedStateKey)
	if err != nil {
		return nil
	}
	gathered, ok := d.(*dynamicresources.AllocatedStateData)
	if !ok || gathered.State == nil {
		return nil
	}
	return &changes{
		base: gathered.State, dra: dra, scope: readScope(cs),
		removed: map[types.UID]*v1.Pod{}, added: map[types.UID][]resourceapi.AllocationResult{},
	}
}

// readChanges returns the cycle's changes, if any.
func readChanges(cs fwk.CycleState) *changes {
	d, err := cs.Read(dynamicresources.AllocatedStateOverrideKey)
	if err != nil {
		return nil
	}
	c, _ := d.(*changes)
	return c
}

func (c *changes) write(cs fwk.CycleState) {
	cs.Write(dynamicresources.AllocatedStateOverrideKey, c)
}

// allocationRecord keeps what Filter allocated on each node: the first
// allocation per node, which, where the framework filters a node twice
// (with its nominated pods, then without), is the one that leaves the
// nominated pods' devices alone.
type allocationRecord struct {
	mu     sync.Mutex
	byNode map[string][]resourceapi.AllocationResult
}

func newAllocationRecord() *allocationRecord {
	return &allocationRecord{byNode: map[string][]resourceapi.AllocationResult{}}
}

func (r *allocationRecord) set(node string, results []resourceapi.AllocationResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byNode[node]; !ok {
		r.byNode[node] = results
	}
}

func (r *allocationRecord) get(node string) ([]resourceapi.AllocationResult, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	results, ok := r.byNode[node]
	return results, ok
}

// releasedClaims are the allocated claims that only the removed pods
// use: every consumer they are reserved for is a removed pod. A claim a
// staying pod also uses, or one reserved for something other than a pod
// (a pod group), stays.
func releasedClaims(dra fwk.SharedDRAManager, removed map[types.UID]*v1.Pod) []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	seen := map[types.UID]bool{}
	for _, pod := range removed {
		for _, claim := range podClaims(dra, pod) {
			if seen[claim.UID] {
				continue
			}
			seen[claim.UID] = true
			if onlyUsedBy(claim, removed) {
				out = append(out, claim)
			}
		}
	}
	return out
}

// onlyUsedBy reports whether an allocated claim is reserved for pods of
// set alone.
func onlyUsedBy[T any](claim *resourceapi.ResourceClaim, set map[types.UID]T) bool {
	if claim.Status.Allocation == nil || len(claim.Status.ReservedFor) == 0 {
		return false
	}
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			return false
		}
		if _, ok := set[r.UID]; !ok {
			return false
		}
	}
	return true
}

// podClaims are the allocated claims a pod uses: those its spec names
// (directly or through a template, as its status records) and the claim
// the scheduler made for its extended resources. A claim its status does
// not name yet, or one not in the scheduler's cache any more, is left
// out: nothing of it is allocated there.
func podClaims(dra fwk.SharedDRAManager, pod *v1.Pod) []*resourceapi.ResourceClaim {
	var names []string
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err == nil && name != nil {
			names = append(names, *name)
		}
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil && s.ResourceClaimName != "" {
		names = append(names, s.ResourceClaimName)
	}
	var out []*resourceapi.ResourceClaim
	for _, name := range names {
		claim, err := dra.ResourceClaims().Get(pod.Namespace, name)
		if err != nil || claim.Status.Allocation == nil {
			continue
		}
		out = append(out, claim)
	}
	return out
}

// forEachDevice calls dedicated for each device a claim's results hold
// whole and shared for each share, with its consumed capacity, as the
// scheduler's tracker of allocated devices counts them (admin access
// holds nothing).
func forEachDevice(results []resourceapi.DeviceRequestAllocationResult,
	dedicated func(structured.DeviceID),
	shared func(structured.SharedDeviceID, structured.DeviceConsumedCapacity)) {
	for _, r := range results {
		if ptr.Deref(r.AdminAccess, false) {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			dedicated(id)
			continue
		}
		consumed := structured.DeviceConsumedCapacity{DeviceID: id}
		if r.ConsumedCapacity != nil {
			consumed = structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity)
		}
		shared(structured.MakeSharedDeviceID(id, r.ShareID), consumed)
	}
}
