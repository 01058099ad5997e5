package sharedseats

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"k8s.io/klog/v2/ktesting"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatkind"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

const sizedConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, sharing: {strategy: mps}}
- {resource: kyb.ai/gpu-2x-sized, seatsPerGroup: 8, sharing: {strategy: mps, sized: true}}
`

const gib = int64(1) << 30

func sizedDevice(groupDevice, request string, seat int, memory, compute int64) checkpoint.Device {
	d := device(groupDevice, request, seat)
	d.Size = &v1alpha1.SeatSize{MemoryBytes: memory, ComputePercent: compute}
	return d
}

// fixedUsage is a ledger's usage that does not change.
type fixedUsage seatledger.Usage

func (f fixedUsage) Last() (seatledger.Usage, bool) { return seatledger.Usage(f), true }
func (f fixedUsage) Fresh(context.Context) (seatledger.Usage, error) {
	return seatledger.Usage(f), nil
}

// A sized request's container is a client with its size: its compute,
// and its memory on each GPU of the group; two sized seats of one
// request add up.
func TestMPSEditGivesASizedRequestItsSize(t *testing.T) {
	n, hw, _ := nodeWith(t, sizedConfig)
	s := &MPS{opts: Options{Node: n}, hw: hw, mps: hw.MPS}
	tests := []struct {
		name    string
		devices []checkpoint.Device
		pct     int
		mem     []int64
		env     string
	}{
		{"one seat", []checkpoint.Device{sizedDevice("g01-2x-sized", "gpu", 0, 20*gib, 25)}, 25, []int64{20480, 20480}, "0=20480M,1=20480M"},
		{"two seats add up", []checkpoint.Device{sizedDevice("g01-2x-sized", "gpu", 0, 20*gib, 25), sizedDevice("g01-2x-sized", "gpu", 3, 4*gib, 10)}, 35, []int64{24576, 24576}, "0=24576M,1=24576M"},
	}
	for _, tc := range tests {
		opts := &containeredits.Options{}
		if err := s.Edit("uid", seatkind.Request{Name: "gpu", Devices: tc.devices, Seats: make([]containeredits.Seat, len(tc.devices)), Options: opts}); err != nil {
			t.Fatal(err)
		}
		if c := opts.MPS; c == nil || c.ActiveThreadPercentage != tc.pct || !slices.Equal(c.PinnedMemMiB, tc.mem) || c.PinnedMemLimit != tc.env {
			t.Errorf("%s: client %+v, want %d %% and %s", tc.name, c, tc.pct, tc.env)
		}
	}
}

// A sized group's daemon holds the largest memory and the largest
// compute a claim holds there; an equal share's group the largest share;
// a group whose configuration changed under held claims the larger of
// both; a group no claim holds, none.
func TestTheDaemonOfASizedGroupHoldsTheLargestSizeHeld(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	n, hw, _ := nodeWith(t, sizedConfig)
	mem := n.Inv.GPUs[0].MemoryMiB
	tests := []struct {
		name   string
		group  string
		usage  seatledger.Usage
		inUse  bool
		limits string
	}{
		{"sized", "g01-2x-sized", seatledger.Usage{Sizes: map[string]v1alpha1.SeatSize{"g01-2x-sized": {MemoryBytes: 40 * gib, ComputePercent: 50}}}, true, "50 0=40960M,1=40960M"},
		{"equal shares", "g0-1x", seatledger.Usage{Largest: map[string]int{"g0-1x": 2}}, true, "50 0=" + itoa(mem/2) + "M"},
		{"both, after a change of configuration", "g0-1x", seatledger.Usage{Largest: map[string]int{"g0-1x": 1}, Sizes: map[string]v1alpha1.SeatSize{"g0-1x": {MemoryBytes: 8 * gib, ComputePercent: 40}}}, true, "40 0=" + itoa(mem/4) + "M"},
		{"none", "g01-2x-sized", seatledger.Usage{}, false, "0 0=0M,1=0M"},
	}
	for _, tc := range tests {
		s := &MPS{opts: Options{Node: n, Usage: fixedUsage(tc.usage)}, hw: hw, mps: hw.MPS, settled: map[string]share{}}
		l, inUse, err := s.want(ctx, n.Group(tc.group))()
		if err != nil {
			t.Fatal(err)
		}
		if got := itoa(int64(l.ActiveThreadPercentage)) + " " + l.MemLimitEnv(); inUse != tc.inUse || got != tc.limits {
			t.Errorf("%s: %q (in use %v), want %q (%v)", tc.name, got, inUse, tc.limits, tc.inUse)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
