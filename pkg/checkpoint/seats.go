package checkpoint

import (
	"fmt"
	"maps"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/types"
)

// SeatKey names seat n of a device in Generations.
func SeatKey(device string, seat int) string { return device + "/" + strconv.Itoa(seat) }

// Holders returns, for a group device, which claim holds each seat.
func (st *State) Holders(groupDevice string) map[int]types.UID {
	out := map[int]types.UID{}
	for uid, c := range st.Claims {
		for _, d := range c.Devices {
			if d.GroupDevice != groupDevice {
				continue
			}
			for _, s := range d.Seats {
				out[s] = uid
			}
		}
	}
	return out
}

// FencedBy returns the claim of a fenced device on groupDevice, if any: it
// holds every seat of the group.
func (st *State) FencedBy(groupDevice string) (types.UID, bool) {
	for _, uid := range slices.Sorted(maps.Keys(st.Claims)) {
		for _, d := range st.Claims[uid].Devices {
			if d.Fenced && d.GroupDevice == groupDevice {
				return uid, true
			}
		}
	}
	return "", false
}

// FreeSeats returns the lowest n seats of device (of seatsPerGroup) that
// no claim holds; a fenced device holds them all.
func (st *State) FreeSeats(device string, seatsPerGroup, n int) ([]int, error) {
	if uid, fenced := st.FencedBy(device); fenced {
		return nil, fmt.Errorf("device %s is fenced: the seats claim %s holds on it are not known, so none is handed out until it is released", device, uid)
	}
	held := st.Holders(device)
	var free []int
	for s := 0; s < seatsPerGroup && len(free) < n; s++ {
		if _, taken := held[s]; !taken {
			free = append(free, s)
		}
	}
	if len(free) < n {
		return nil, fmt.Errorf("device %s has %d free seat(s) of %d, %d needed", device, seatsPerGroup-len(held), seatsPerGroup, n)
	}
	return free, nil
}

// NextGeneration hands seat out once more and returns its new generation.
func (st *State) NextGeneration(device string, seat int) int64 {
	k := SeatKey(device, seat)
	st.Generations[k] = max(st.Generations[k], st.GenerationFloor) + 1
	return st.Generations[k]
}

// lostHandouts bounds how often one seat can have been handed out between
// a save and its flush to disk: far more than any node prepares in the
// milliseconds a flush takes.
const lostHandouts = 1024

// RaiseGenerationFloor is for a state that may have lost its last saves
// (a power loss before they reached the disk): every seat's next
// generation is made larger than min (the clock, in seconds), and than
// any generation the state records by a margin no lost save can have
// used, so that no generation handed out before repeats.
func (st *State) RaiseGenerationFloor(min int64) {
	floor := max(st.GenerationFloor, min)
	for _, g := range st.Generations {
		floor = max(floor, g+lostHandouts)
	}
	st.GenerationFloor = floor
}
