// Package groupshare is the hardware side of a profile's sharing strategy,
// the same for the DRA plugin and the device-plugin shim: which MPS daemon
// a group has and what its clients get, and a time-slicing profile's
// interval on the group's GPUs. Who holds which seats, and so when a
// daemon starts, changes its limits or stops, is each plugin's own
// business: the DRA plugin knows it from its ledger, the shim from the
// kubelet's PodResources API.
package groupshare

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// Hardware applies sharing strategies to a node's GPUs.
type Hardware struct {
	Inv *inventory.Inventory
	// MPS runs the daemons of groups whose profile uses mps; nil refuses
	// their seats.
	MPS *mps.Manager
	// SetTimeSlice sets the time slice of GPUs (by index), for
	// timeSlicing profiles that name an interval; nil refuses their seats.
	SetTimeSlice func(ctx context.Context, gpus []int, interval v1alpha1.TimeSliceInterval) error

	mu sync.Mutex
	// slices are the intervals this process applied, per GPU index.
	slices map[int]v1alpha1.TimeSliceInterval
}

// ErrNoMPS is the error of an MPS seat on a node whose plugin was started
// without MPS daemons.
func ErrNoMPS(g *planner.Group) error {
	return fmt.Errorf("group %s: profile %s shares its groups with MPS, but this plugin was started without MPS daemons", g.Name, g.Profile.Name)
}

// UsesMPS tells whether g's profile shares it with MPS.
func UsesMPS(g *planner.Group) bool {
	return g != nil && g.Profile.Sharing == v1alpha1.SharingMPS
}

// MPSGroup is g's daemon: named after its device, serving its GPUs, and
// keeping their compute mode where g's profile says so.
func (h *Hardware) MPSGroup(g *planner.Group) mps.Group {
	out := mps.Group{Name: g.DeviceName(), KeepComputeMode: g.Profile.MPSComputeMode == v1alpha1.MPSComputeModeKeep}
	for _, x := range g.GPUs {
		if gpu, ok := h.Inv.GPUByIndex(x); ok {
			out.UUIDs = append(out.UUIDs, gpu.UUID)
		}
	}
	return out
}

// Share is what a holder of k of g's seats gets.
func (h *Hardware) Share(g *planner.Group, k int) mps.Limits {
	mem := make([]int64, len(g.GPUs))
	for i, x := range g.GPUs {
		if gpu, ok := h.Inv.GPUByIndex(x); ok {
			mem[i] = gpu.MemoryMiB
		}
	}
	return mps.Share(k, g.Seats(), mem)
}

// Want is what g's daemon must hold while the largest holder has k seats
// (none: no daemon).
func (h *Hardware) Want(g *planner.Group, k int) (mps.Limits, bool) {
	return h.Share(g, k), k > 0
}

// Sized is what a holder of size on g's sized seats gets: its compute,
// and its memory on each of g's GPUs.
func (h *Hardware) Sized(g *planner.Group, size v1alpha1.SeatSize) mps.Limits {
	return mps.Sized(size.MemoryBytes, size.ComputePercent, len(g.GPUs))
}

// Client is what makes a container holding k of g's seats a client of
// g's daemon.
func (h *Hardware) Client(g *planner.Group, k int) (*containeredits.MPS, error) {
	return h.ClientWith(g, h.Share(g, k))
}

// ClientWith is what makes a container a client of g's daemon with
// limits l (a sized seat's, or an equal share's).
func (h *Hardware) ClientWith(g *planner.Group, l mps.Limits) (*containeredits.MPS, error) {
	if h.MPS == nil {
		return nil, ErrNoMPS(g)
	}
	dir := h.MPS.Dir(g.DeviceName())
	return &containeredits.MPS{
		HostPipeDir:            filepath.Join(dir, mps.PipeDir),
		ContainerPipeDir:       mps.ContainerPipeDir,
		PipeWritable:           h.MPS.ClientPipeWritable(),
		HostShmDir:             filepath.Join(dir, mps.ShmDir),
		ActiveThreadPercentage: l.ActiveThreadPercentage,
		PinnedMemLimit:         l.MemLimitEnv(),
		PinnedMemMiB:           l.PinnedMemMiB,
	}, nil
}

// ApplyTimeSlice sets g's profile's interval on those of its GPUs this
// process has not set it on yet.
func (h *Hardware) ApplyTimeSlice(ctx context.Context, g *planner.Group) error {
	if g.Profile.TimeSlice == "" {
		return nil
	}
	if h.SetTimeSlice == nil {
		return errors.New("the plugin cannot set time slices on this node")
	}
	h.mu.Lock()
	var todo []int
	for _, x := range g.GPUs {
		if h.slices[x] != g.Profile.TimeSlice {
			todo = append(todo, x)
		}
	}
	h.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if err := h.SetTimeSlice(ctx, todo, g.Profile.TimeSlice); err != nil {
		return err
	}
	h.mu.Lock()
	if h.slices == nil {
		h.slices = map[int]v1alpha1.TimeSliceInterval{}
	}
	for _, x := range todo {
		h.slices[x] = g.Profile.TimeSlice
	}
	h.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Set time slice", "group", g.Name, "gpus", todo, "interval", g.Profile.TimeSlice)
	return nil
}
