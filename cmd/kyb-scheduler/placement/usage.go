package placement

import (
	"sync"

	"k8s.io/apimachinery/pkg/util/sets"
	draapi "k8s.io/dynamic-resource-allocation/api"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// allocated is what the scheduler's allocated state holds of our
// devices: the allocations in the API, those it has assumed after writing
// them, and those of pods in flight (reserved, not yet bound), which the
// DRA plugin's claim tracker adds (SharedDRAManager). Devices are looked
// up by their interned IDs, so that a pod's score costs no pass over the
// cluster's allocations: a share of a device that publishes seats
// consumes at least one (its request policy's minimum), so the consumed
// capacity, keyed by device, tells which shared devices are in use. Only
// a shared device without seats needs the shares themselves, which the
// state keys by share; they are gathered by device once, on first need.
type allocated struct {
	state *structured.AllocatedState
	// Nodes are predicted in parallel: the shares are gathered once.
	once   sync.Once
	shared sets.Set[structured.DeviceID]
}

func ourAllocations(state *structured.AllocatedState) *allocated {
	return &allocated{state: state}
}

// use says whether a device is in use (an ordinary device allocated, a
// shared one with a share) and how many seats its shares consume.
func (a *allocated) use(d *device) (inUse bool, seats int64) {
	// The state keeps an ordinary device's allocation by device, a shared
	// one's by share (the allocator gives a share ID exactly where the
	// device allows several): one look-up each where most devices are
	// free.
	if !d.shared {
		return a.state.AllocatedDevices.Has(d.id), 0
	}
	if c, ok := a.state.AggregatedCapacity[d.id]; ok {
		if q := c[seatsCapacity]; q != nil {
			seats = q.Value()
		}
		return true, seats
	}
	if d.seatsPublished {
		return false, 0
	}
	return a.sharedDevices().Has(d.id), 0
}

func (a *allocated) sharedDevices() sets.Set[structured.DeviceID] {
	a.once.Do(func() {
		a.shared = sets.New[structured.DeviceID]()
		ourDriver := draapi.MakeUniqueString(driver.Name)
		for id := range a.state.AllocatedSharedDeviceIDs {
			if id.Driver == ourDriver {
				a.shared.Insert(structured.DeviceID{Driver: id.Driver, Pool: id.Pool, Device: id.Device})
			}
		}
	})
	return a.shared
}
