package draplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

// Sharing applies the profiles' sharing strategies to the hardware.
type Sharing struct {
	// MPS runs the daemons of groups whose profile uses mps; nil refuses
	// their claims.
	MPS *mps.Manager
	// SetTimeSlice sets the time slice of GPUs (by index), for
	// timeSlicing profiles that name an interval; nil refuses their claims.
	SetTimeSlice func(ctx context.Context, gpus []int, interval v1alpha1.TimeSliceInterval) error
}

// sharing keeps each group in use sharing its GPUs as its profile says:
// the MPS daemon of a group runs from the prepare of its first seat to the
// release of its last, holding the largest share a claim has there; a
// timeSlicing profile's interval is applied to a group's GPUs before its
// seats are used.
type sharing struct {
	Sharing
	node nodePlan
	hw   *groupshare.Hardware

	mu sync.Mutex
	// largest is the ledger's Usage.Largest, kept as it changes; changed
	// are the MPS groups whose share changed since they were settled.
	largest map[string]int
	changed map[string]bool
	// known: the ledger told its usage; until then (a lost checkpoint
	// not yet rebuilt) no daemon is stopped, since which groups are in
	// use is not known.
	known bool
}

func newSharing(s Sharing, node nodePlan) *sharing {
	hw := &groupshare.Hardware{Inv: node.inv, MPS: s.MPS, SetTimeSlice: s.SetTimeSlice}
	return &sharing{Sharing: s, node: node, hw: hw, largest: map[string]int{}, changed: map[string]bool{}}
}

// setUsage is the ledger's UsageChanged (with the ledger's lock held). It
// notes the MPS groups whose largest share changed, for settle.
func (s *sharing) setUsage(u seatledger.Usage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, gd := range slices.Concat(slices.Collect(maps.Keys(s.largest)), slices.Collect(maps.Keys(u.Largest))) {
		if s.largest[gd] != u.Largest[gd] && s.usesMPS(gd) {
			s.changed[gd] = true
		}
	}
	s.largest = maps.Clone(u.Largest)
	s.known = true
}

func (s *sharing) held(groupDevice string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.largest[groupDevice] > 0
}

func (s *sharing) usesMPS(groupDevice string) bool {
	return groupshare.UsesMPS(s.node.group(groupDevice))
}

func (s *sharing) want(g *planner.Group) mps.Want {
	return func() (mps.Limits, bool, error) {
		s.mu.Lock()
		k := s.largest[g.DeviceName()]
		delete(s.changed, g.DeviceName())
		s.mu.Unlock()
		limits, inUse := s.hw.Want(g, k)
		return limits, inUse, nil
	}
}

// prepare readies the groups of a claim before its spec is written: their
// MPS daemons answer with the claim's share, their time slices are set. A
// failure fails this claim only.
func (s *sharing) prepare(ctx context.Context, c *checkpoint.Claim) error {
	for _, dev := range c.Devices {
		if dev.AdminAccess {
			continue // monitoring: NVML, not an MPS client
		}
		g := s.node.group(dev.GroupDevice)
		if g == nil {
			continue
		}
		switch {
		case g.Profile.Sharing == v1alpha1.SharingMPS:
			if s.MPS == nil {
				return groupshare.ErrNoMPS(g)
			}
			if err := s.MPS.Ensure(ctx, s.hw.MPSGroup(g), s.want(g)); err != nil {
				return fmt.Errorf("group %s: %w", g.Name, err)
			}
		case g.Profile.TimeSlice != "":
			if err := s.hw.ApplyTimeSlice(ctx, g); err != nil {
				return fmt.Errorf("group %s: %w", g.Name, err)
			}
		}
	}
	return nil
}

// settle stops the daemons of MPS groups no claim uses any more and sets
// new limits where the largest share changed; after releases, and at
// start for every daemon found (adopting those in use, stopping those a
// plugin that went away left behind). Failures are logged: a release has
// already succeeded.
func (s *sharing) settle(ctx context.Context, all bool) {
	if s.MPS == nil {
		return
	}
	s.mu.Lock()
	names := slices.Sorted(maps.Keys(s.changed))
	known := s.known
	s.mu.Unlock()
	if !known {
		klog.FromContext(ctx).Info("Which groups are in use is not known yet (the checkpoint is being rebuilt); MPS daemons are left as they are")
		return
	}
	if all {
		dirs, err := s.MPS.Known()
		if err != nil {
			klog.FromContext(ctx).Error(err, "Cannot list MPS daemons")
		}
		s.mu.Lock()
		names = append(append(names, dirs...), slices.Collect(maps.Keys(s.largest))...)
		s.mu.Unlock()
		slices.Sort(names)
		names = slices.Compact(names)
	}
	for _, name := range names {
		g := s.node.group(name)
		var err error
		switch {
		case g == nil && s.held(name):
			// A claim still holds a group an earlier configuration
			// defined: its containers keep their daemon until it goes.
			continue
		case g == nil:
			// A daemon of a group today's plan lacks (found at start):
			// stopped by its directory alone, its GPUs unknown now.
			err = s.MPS.Settle(ctx, mps.Group{Name: name}, mps.Unused())
		case g.Profile.Sharing != v1alpha1.SharingMPS:
			continue
		case all:
			// At start: check that a daemon of a group in use still runs.
			err = s.MPS.Ensure(ctx, s.hw.MPSGroup(g), s.want(g))
		default:
			err = s.MPS.Settle(ctx, s.hw.MPSGroup(g), s.want(g))
		}
		if err != nil {
			klog.FromContext(ctx).Error(err, "Cannot settle MPS daemon", "mpsDaemon", name)
		}
	}
}

// mpsEdits are the container edits that make a request's container a
// client of its group's daemon, or nil where its groups do not use MPS.
// A container reaches one daemon only (one CUDA_MPS_PIPE_DIRECTORY), so a
// request holding seats of an MPS group holds seats of that group only.
func (s *sharing) mpsEdits(devs []checkpoint.Device) (*containeredits.MPS, error) {
	var g *planner.Group
	k := 0
	usesMPS := false
	for _, dev := range devs {
		dg := s.node.group(dev.GroupDevice)
		if dg == nil || dev.AdminAccess {
			continue
		}
		if dg.Profile.Sharing == v1alpha1.SharingMPS {
			usesMPS = true
		}
		if g != nil && dg != g {
			if usesMPS {
				return nil, fmt.Errorf("the request holds seats of groups %s and %s, and a container reaches one MPS daemon only: request seats of one MPS group per request", g.Name, dg.Name)
			}
		}
		g = dg
		k += len(dev.Seats)
	}
	if !usesMPS || k == 0 {
		return nil, nil
	}
	return s.hw.Client(g, k)
}

// watchHealth stops the MPS daemon of a group one of whose GPUs is lost
// (its clients are gone with the GPU, and a daemon on a lost GPU answers
// nothing useful), and starts it again when the GPU comes back while the
// group is in use.
func (s *sharing) watchHealth(ctx context.Context, view health.View, changed <-chan struct{}) {
	if s.MPS == nil || changed == nil {
		return
	}
	down := map[string]bool{}
	for {
		faults := view.Faults()
		for _, g := range s.node.plan.Groups() {
			if g.Profile.Sharing != v1alpha1.SharingMPS {
				continue
			}
			lost := slices.ContainsFunc(g.GPUs, func(x int) bool { f, ok := faults[x]; return ok && f.Kind == health.KindLost })
			name := g.DeviceName()
			switch {
			case lost && !down[name]:
				down[name] = true
				if err := s.MPS.Settle(ctx, s.hw.MPSGroup(g), mps.Unused()); err != nil {
					klog.FromContext(ctx).Error(err, "Cannot stop the MPS daemon of a group with a lost GPU", "mpsDaemon", name)
				} else {
					klog.FromContext(ctx).Info("Stopped the MPS daemon of a group with a lost GPU", "mpsDaemon", name)
				}
			case !lost && down[name]:
				delete(down, name)
				if err := s.MPS.Ensure(ctx, s.hw.MPSGroup(g), s.want(g)); err != nil {
					klog.FromContext(ctx).Error(err, "Cannot start the MPS daemon again after its GPU came back", "mpsDaemon", name)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}
