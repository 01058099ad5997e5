package placement

import (
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// devKey names a device of ours: its pool and its name.
type devKey struct{ pool, device string }

// allocated is what the scheduler's allocated state holds of our
// devices: the allocations in the API, those it has assumed after writing
// them, and those of pods in flight (reserved, not yet bound), which the
// DRA plugin's claim tracker adds (SharedDRAManager).
type allocated struct {
	// inUse: an ordinary device allocated, or a shared one with a share.
	inUse map[devKey]bool
	// seats consumed of each shared device.
	seats map[devKey]int64
}

func ourAllocations(state *structured.AllocatedState) allocated {
	a := allocated{inUse: map[devKey]bool{}, seats: map[devKey]int64{}}
	for id := range state.AllocatedDevices {
		if id.Driver.String() == driver.Name {
			a.inUse[devKey{id.Pool.String(), id.Device.String()}] = true
		}
	}
	for id := range state.AllocatedSharedDeviceIDs {
		if id.Driver.String() == driver.Name {
			a.inUse[devKey{id.Pool.String(), id.Device.String()}] = true
		}
	}
	for id, consumed := range state.AggregatedCapacity {
		if id.Driver.String() != driver.Name {
			continue
		}
		if q := consumed[seatsCapacity]; q != nil {
			k := devKey{id.Pool.String(), id.Device.String()}
			a.seats[k] += q.Value()
			a.inUse[k] = true
		}
	}
	return a
}
