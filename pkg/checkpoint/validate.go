package checkpoint

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
)

// MaxGeneration bounds every generation and floor a state may record: far
// above any clock in seconds, and far enough below the largest int64 that
// raising the floor past a lost save (RaiseGenerationFloor) and handing
// seats out again cannot overflow.
const MaxGeneration = 1 << 62

// cdiName is what a CDI device name may hold (the CDI specification's
// rule); a device's CDIDevice becomes part of one.
var cdiName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// Validate checks that a state contradicts neither itself nor what a
// plugin writes: every list of a device has the lengths of its partner,
// seats and GPUs are unique and not negative, no seat is held by two
// devices, every generation handed out is below the seat's recorded
// count and MaxGeneration, and every claim UID is one a CDI spec can be
// written for. A state that passes may still not fit today's node (its groups
// may have changed); that is the seat ledger's to judge.
func (st *State) Validate() error {
	if st.GenerationFloor < 0 || st.GenerationFloor > MaxGeneration {
		return fmt.Errorf("generationFloor %d is not between 0 and %d", st.GenerationFloor, int64(MaxGeneration))
	}
	for key, n := range st.Generations {
		dev, seat, ok := strings.Cut(key, "/")
		if s, err := strconv.Atoi(seat); !ok || dev == "" || err != nil || s < 0 || n < 0 || n > MaxGeneration {
			return fmt.Errorf("generations[%q] = %d: want <device>/<seat> with a seat that is not negative and a count between 0 and %d", key, n, int64(MaxGeneration))
		}
	}
	holder := map[string]types.UID{}
	for _, uid := range slices.Sorted(maps.Keys(st.Claims)) {
		c := st.Claims[uid]
		if c == nil {
			return fmt.Errorf("claim %s has no entry", uid)
		}
		if c.Name == "" || c.Namespace == "" {
			return fmt.Errorf("claim %s has no namespace or name", uid)
		}
		if err := cdi.CheckClaimUID(uid); err != nil {
			return err
		}
		if c.Phase != PrepareStarted && c.Phase != PrepareCompleted {
			return fmt.Errorf("claim %s: unknown phase %q", uid, c.Phase)
		}
		for i := range c.Devices {
			d := &c.Devices[i]
			if err := d.validate(); err != nil {
				return fmt.Errorf("claim %s device %d (%s): %w", uid, i, d.Device, err)
			}
			for j, s := range d.Seats {
				k := SeatKey(d.GroupDevice, s)
				if other, held := holder[k]; held {
					return fmt.Errorf("claim %s device %d (%s): seat %d of %s is also held by claim %s", uid, i, d.Device, s, d.GroupDevice, other)
				}
				holder[k] = uid
				if st.Generations[k] < d.Generations[j] {
					return fmt.Errorf("claim %s device %d (%s): seat %d has generation %d, above the %d recorded for it", uid, i, d.Device, s, d.Generations[j], st.Generations[k])
				}
			}
		}
	}
	return nil
}

// validate checks one device on its own.
func (d *Device) validate() error {
	switch {
	case len(d.Requests) == 0 || slices.Contains(d.Requests, ""):
		return fmt.Errorf("requests %q: want at least one, none empty", d.Requests)
	case d.Pool == "" || d.Device == "" || d.GroupDevice == "":
		return fmt.Errorf("pool %q, device %q, group device %q: none may be empty", d.Pool, d.Device, d.GroupDevice)
	case !cdiName.MatchString(d.CDIDevice):
		return fmt.Errorf("CDI device %q is not a CDI device name", d.CDIDevice)
	case len(d.GPUs) == 0 || len(d.GPUs) != len(d.GPUUUIDs):
		return fmt.Errorf("%d GPUs and %d GPU UUIDs: want as many of each, at least one", len(d.GPUs), len(d.GPUUUIDs))
	case !unique(d.GPUs):
		return fmt.Errorf("GPUs %v: want distinct indices that are not negative", d.GPUs)
	case d.Fenced && d.AdminAccess:
		return fmt.Errorf("a device with admin access holds no seat and cannot be fenced")
	case (d.Fenced || d.AdminAccess) && (len(d.Seats) > 0 || len(d.Generations) > 0):
		return fmt.Errorf("a fenced device or one with admin access records no seats, not %v", d.Seats)
	case !d.Fenced && !d.AdminAccess && (len(d.Seats) == 0 || len(d.Seats) != len(d.Generations)):
		return fmt.Errorf("%d seats and %d generations: want as many of each, at least one", len(d.Seats), len(d.Generations))
	case !unique(d.Seats):
		return fmt.Errorf("seats %v: want distinct seats that are not negative", d.Seats)
	}
	for _, g := range d.Generations {
		if g < 1 {
			return fmt.Errorf("generations %v: a seat handed out has a generation of 1 or more", d.Generations)
		}
	}
	if s := d.Size; s != nil {
		switch {
		case len(d.Seats) != 1:
			return fmt.Errorf("a sized seat's device holds one seat, not %d", len(d.Seats))
		case s.MemoryBytes < 1 || s.ComputePercent < 1 || s.ComputePercent > v1alpha1.MaxCompute:
			return fmt.Errorf("size %+v: want memory of 1 byte or more and compute between 1 and %d", *s, v1alpha1.MaxCompute)
		}
	}
	return nil
}

// unique reports whether xs are distinct and none is negative.
func unique(xs []int) bool {
	seen := map[int]bool{}
	for _, x := range xs {
		if x < 0 || seen[x] {
			return false
		}
		seen[x] = true
	}
	return true
}
