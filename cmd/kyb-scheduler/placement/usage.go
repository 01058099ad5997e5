package placement

import (
	"k8s.io/apimachinery/pkg/util/sets"
	draapi "k8s.io/dynamic-resource-allocation/api"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// allocated is what the scheduler's allocated state holds of our
// devices: the allocations in the API, those it has assumed after writing
// them, and those of pods in flight (reserved, not yet bound), which the
// DRA plugin's claim tracker adds (SharedDRAManager). Devices are looked
// up by their interned IDs, so that a pod's score costs no copy of the
// cluster's allocations; only the shares, which the state keys by share,
// are gathered by device.
type allocated struct {
	state  *structured.AllocatedState
	shared sets.Set[structured.DeviceID]
}

func ourAllocations(state *structured.AllocatedState) allocated {
	a := allocated{state: state, shared: sets.New[structured.DeviceID]()}
	ourDriver := draapi.MakeUniqueString(driver.Name)
	for id := range state.AllocatedSharedDeviceIDs {
		if id.Driver == ourDriver {
			a.shared.Insert(structured.DeviceID{Driver: id.Driver, Pool: id.Pool, Device: id.Device})
		}
	}
	return a
}

// use says whether a device is in use (an ordinary device allocated, a
// shared one with a share) and how many seats its shares consume.
func (a allocated) use(id structured.DeviceID) (inUse bool, seats int64) {
	if q := a.state.AggregatedCapacity[id][seatsCapacity]; q != nil {
		seats = q.Value()
	}
	return a.state.AllocatedDevices.Has(id) || a.shared.Has(id) || seats > 0, seats
}
