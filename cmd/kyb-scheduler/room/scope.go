package room

import (
	"sync"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"
)

// scopeKey holds the cycle's scope, shared by its clones.
const scopeKey fwk.StateKey = Name + "/scope"

// scope is the cycle's gathered allocated state by pool, and the pools
// each node can use: a node's allocator looks at its pools' allocations
// only, so the state Filter allocates against on a node is built from
// those, not from a copy of every allocation in the cluster. A dry run
// tries many sets of victims on each node; each costs the node's
// allocations, not the cluster's.
type scope struct {
	dra fwk.SharedDRAManager

	once sync.Once
	// byPool is the gathered state split by pool; local, the pools of
	// slices that name a node, by node; shared, those of slices that do
	// not (every node may use them).
	byPool map[poolID]*structured.AllocatedState
	local  map[string]sets.Set[poolID]
	shared sets.Set[poolID]

	mu     sync.Mutex
	byNode map[string]*structured.AllocatedState
}

type poolID struct{ driver, pool string }

func (s *scope) Clone() fwk.StateData { return s }

func readScope(cs fwk.CycleState) *scope {
	d, err := cs.Read(scopeKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*scope)
	return s
}

// forNode is the part of base that the node's allocator reads. It is
// shared: callers copy before they change it.
func (s *scope) forNode(base *structured.AllocatedState, node string) *structured.AllocatedState {
	s.once.Do(func() { s.split(base) })
	if s.byPool == nil {
		return base
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.byNode[node]; ok {
		return st
	}
	out := emptyState()
	for _, pools := range []sets.Set[poolID]{s.local[node], s.shared} {
		for id := range pools {
			part := s.byPool[id]
			if part == nil {
				continue
			}
			out.AllocatedDevices = out.AllocatedDevices.Union(part.AllocatedDevices)
			out.AllocatedSharedDeviceIDs = out.AllocatedSharedDeviceIDs.Union(part.AllocatedSharedDeviceIDs)
			for id, c := range part.AggregatedCapacity {
				out.AggregatedCapacity[id] = c
			}
		}
	}
	if s.byNode == nil {
		s.byNode = map[string]*structured.AllocatedState{}
	}
	s.byNode[node] = out
	return out
}

// split sorts base by pool. Where the slices cannot be listed, byPool
// stays nil and every node gets the whole state.
func (s *scope) split(base *structured.AllocatedState) {
	slices, err := s.dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return
	}
	s.local, s.shared = map[string]sets.Set[poolID]{}, sets.New[poolID]()
	for _, sl := range slices {
		id := poolID{sl.Spec.Driver, sl.Spec.Pool.Name}
		if node := ptr.Deref(sl.Spec.NodeName, ""); node != "" {
			if s.local[node] == nil {
				s.local[node] = sets.New[poolID]()
			}
			s.local[node].Insert(id)
			continue
		}
		s.shared.Insert(id)
	}
	byPool := map[poolID]*structured.AllocatedState{}
	of := func(d structured.DeviceID) *structured.AllocatedState {
		id := poolID{d.Driver.String(), d.Pool.String()}
		if byPool[id] == nil {
			byPool[id] = emptyState()
		}
		return byPool[id]
	}
	for d := range base.AllocatedDevices {
		of(d).AllocatedDevices.Insert(d)
	}
	for d := range base.AllocatedSharedDeviceIDs {
		of(d.GetDeviceID()).AllocatedSharedDeviceIDs.Insert(d)
	}
	for d, c := range base.AggregatedCapacity {
		of(d).AggregatedCapacity[d] = c
	}
	s.byPool = byPool
}

func emptyState() *structured.AllocatedState {
	return &structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.ConsumedCapacityCollection{},
	}
}
