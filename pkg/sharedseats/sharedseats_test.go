package sharedseats

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatkind"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

const config = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, sharing: {strategy: mps}}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 2, sharing: {timeSlicing: {interval: Long}}}
`

// device is a claim's device holding seats of a group device.
func device(groupDevice string, request string, seats ...int) checkpoint.Device {
	return checkpoint.Device{Device: groupDevice, GroupDevice: groupDevice, Requests: []string{request}, SeatStatus: v1alpha1.SeatStatus{Seats: seats}}
}

func node(t *testing.T) (draresources.Node, *groupshare.Hardware, *[][]int) {
	t.Helper()
	return nodeWith(t, config)
}

func nodeWith(t *testing.T, config string) (draresources.Node, *groupshare.Hardware, *[][]int) {
	t.Helper()
	sn := simnodetest.New(t, "nvlink-2x4", config)
	m, err := mps.NewManager(mps.Options{Root: t.TempDir(), Control: []string{"nvidia-cuda-mps-control"}, SetExclusive: func(context.Context, string, bool) error { return nil }, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		t.Fatal(err)
	}
	var sliced [][]int
	hw := &groupshare.Hardware{Inv: sn.Inv, MPS: m, SetTimeSlice: func(_ context.Context, gpus []int, _ v1alpha1.TimeSliceInterval) error {
		sliced = append(sliced, gpus)
		return nil
	}}
	return draresources.NewNode("node-1", sn.Plan, sn.Inv), hw, &sliced
}

// A request's container is a client of its group's daemon with the
// request's share of the group, computed once, which the request's device
// metadata reads too; a request of an MPS group with seats of another
// group is refused, since a container reaches one daemon only.
func TestMPSEditGivesTheRequestItsShare(t *testing.T) {
	n, hw, _ := node(t)
	s := &MPS{opts: Options{Node: n}, hw: hw, mps: hw.MPS}
	mem := n.Inv.GPUs[0].MemoryMiB
	opts := &containeredits.Options{}
	devs := []checkpoint.Device{device("g0-1x", "gpu", 0, 1)}
	if err := s.Edit("uid", seatkind.Request{Name: "gpu", Devices: devs, Seats: make([]containeredits.Seat, 1), Options: opts}); err != nil {
		t.Fatal(err)
	}
	if c := opts.MPS; c == nil || c.ActiveThreadPercentage != 50 || !slices.Equal(c.PinnedMemMiB, []int64{mem / 2}) || !strings.HasSuffix(c.HostPipeDir, "/g0-1x/pipe") {
		t.Errorf("client %+v, want 50%% of g0-1x and half of its %d MiB", c, mem)
	}
	spanning := []checkpoint.Device{devs[0], device("g1-1x", "gpu", 0)}
	err := s.Edit("uid", seatkind.Request{Name: "gpu", Devices: spanning, Seats: make([]containeredits.Seat, 2), Options: &containeredits.Options{}})
	if err == nil || !strings.Contains(err.Error(), "a container reaches one MPS daemon only") {
		t.Errorf("a request over two groups: %v", err)
	}
	plain := &containeredits.Options{}
	if err := s.Edit("uid", seatkind.Request{Name: "gpu", Devices: []checkpoint.Device{device("g01-2x", "gpu", 1)}, Seats: make([]containeredits.Seat, 1), Options: plain}); err != nil || plain.MPS != nil {
		t.Errorf("a time-sliced group's request: %+v, %v; want no client", plain.MPS, err)
	}
}

// A time-sliced seat's prepare sets its profile's interval on its group's
// GPUs; an MPS seat's and an admin-access device's set none. A node that
// cannot set time slices fails the claim, as a sharing failure.
func TestTimeSlicedPrepareSetsTheIntervalOfItsGroups(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	n, hw, sliced := node(t)
	ts := NewTimeSliced(Options{Node: n, Hardware: hw})
	admin := device("g23-2x", "watch")
	admin.AdminAccess = true
	c := &checkpoint.Claim{Devices: []checkpoint.Device{device("g0-1x", "a", 0), device("g01-2x", "b", 1), admin}}
	if err := ts.Prepare(ctx, "uid", c); err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(*sliced, [][]int{{0, 1}}, slices.Equal) {
		t.Errorf("time slices set on %v, want GPUs 0,1 of g01-2x alone", *sliced)
	}
	none := NewTimeSliced(Options{Node: n})
	if err := none.Prepare(ctx, "uid", c); err == nil || !errors.Is(err, seatkind.ErrSharing) {
		t.Errorf("without a time-slice setter: %v, want a sharing failure", err)
	}
}
