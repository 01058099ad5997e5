package draplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

// Sharing applies the profiles' sharing strategies to the hardware.
type Sharing struct {
	// Hardware runs the MPS daemons and sets time slices
	// (nodesetup.SharingFlags.Hardware); nil refuses the claims of
	// profiles that need either.
	Hardware *groupshare.Hardware
	// WatchInterval is how often the daemons of groups in use are checked
	// (default 5s): one that ended is started again. The check reads
	// /proc; no daemon is asked anything.
	WatchInterval time.Duration
}

// sharing keeps each group in use sharing its GPUs as its profile says:
// the MPS daemon of a group runs from the prepare of its first seat to the
// release of its last, holding the largest share a claim has there; a
// timeSlicing profile's interval is applied to a group's GPUs before its
// seats are used.
//
// Which claims hold a group is the ledger's. Where another plugin instance
// serves the node too (a rolling update), each instance's ledger knows the
// other's claims only once it reads the checkpoint again, so every
// decision about a daemon (start, limits, stop) reads it first, under the
// file lock the instances share and the daemon's own lock (reload): an
// instance never stops, or lowers, a daemon a claim of the other needs.
type sharing struct {
	Sharing
	node draresources.Node
	hw   *groupshare.Hardware
	// mps is hw's daemons, nil where the node runs none.
	mps *mps.Manager
	// reload reads the checkpoint again where another instance may have
	// changed it (nil: this instance alone writes it).
	reload func(ctx context.Context) error
	// events and restarts report daemons started again by the watcher.
	events   *nodeevents.Recorder
	restarts *prometheus.CounterVec

	mu sync.Mutex
	// largest is the ledger's Usage.Largest, kept as it changes; changed
	// are the groups whose share changed since they were settled.
	largest map[string]int
	changed map[string]bool
	// known: the ledger told its usage; until then (a lost checkpoint
	// not yet rebuilt) no daemon is stopped, since which groups are in
	// use is not known.
	known bool
	// down are the MPS groups with a lost GPU, whose daemons are halted
	// until the GPU comes back.
	down map[string]bool

	// failing are the groups whose daemon the watcher keeps failing to
	// settle (its goroutine's alone).
	failing map[string]*watchFailure
}

func newSharing(s Sharing, node draresources.Node) *sharing {
	if s.WatchInterval <= 0 {
		s.WatchInterval = 5 * time.Second
	}
	hw := s.Hardware
	if hw == nil {
		hw = &groupshare.Hardware{Inv: node.Inv}
	}
	return &sharing{Sharing: s, node: node, hw: hw, mps: hw.MPS, largest: map[string]int{}, changed: map[string]bool{}, down: map[string]bool{}, failing: map[string]*watchFailure{},
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kyb_mps_daemon_restarts_total", Help: "MPS control daemons started again after they ended while their group was in use, by group.",
		}, []string{"group"})}
}

// setUsage is the ledger's UsageChanged (with the ledger's lock held). It
// notes the groups whose largest share changed, for settle: those of MPS
// groups, and of groups whose profile no longer uses MPS, whose daemon
// stops once their last claim goes.
func (s *sharing) setUsage(u seatledger.Usage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, gd := range slices.Concat(slices.Collect(maps.Keys(s.largest)), slices.Collect(maps.Keys(u.Largest))) {
		if s.largest[gd] != u.Largest[gd] {
			s.changed[gd] = true
		}
	}
	s.largest = maps.Clone(u.Largest)
	s.known = true
}

// refresh reads the checkpoint again where another instance shares it.
func (s *sharing) refresh(ctx context.Context, name string) error {
	if s.reload == nil {
		return nil
	}
	if err := s.reload(ctx); err != nil {
		return fmt.Errorf("read which claims hold group %s from the checkpoint shared with the other plugin instance: %w", name, err)
	}
	return nil
}

func (s *sharing) want(ctx context.Context, g *planner.Group) mps.Want {
	return func() (mps.Limits, bool, error) {
		if err := s.refresh(ctx, g.DeviceName()); err != nil {
			return mps.Limits{}, false, err
		}
		s.mu.Lock()
		k := s.largest[g.DeviceName()]
		delete(s.changed, g.DeviceName())
		s.mu.Unlock()
		limits, inUse := s.hw.Want(g, k)
		return limits, inUse, nil
	}
}

// held tells whether a claim holds the group: while one does, the daemon
// of a group that no longer uses MPS stays for its containers.
func (s *sharing) held(ctx context.Context, name string) func() (bool, error) {
	return func() (bool, error) {
		if err := s.refresh(ctx, name); err != nil {
			return false, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.changed, name)
		return s.largest[name] > 0, nil
	}
}

func (s *sharing) isDown(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down[name]
}

// prepare readies the groups of a claim before its spec is written: their
// MPS daemons answer with the claim's share, their time slices are set. A
// failure fails this claim only.
func (s *sharing) prepare(ctx context.Context, c *checkpoint.Claim) error {
	for _, dev := range c.Devices {
		if dev.AdminAccess {
			continue // monitoring: NVML, not an MPS client
		}
		g := s.node.Group(dev.GroupDevice)
		if g == nil {
			continue
		}
		switch {
		case g.Profile.Sharing == v1alpha1.SharingMPS:
			if s.mps == nil {
				return groupshare.ErrNoMPS(g)
			}
			if err := s.mps.Ensure(ctx, s.hw.MPSGroup(g), s.want(ctx, g)); err != nil {
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

// settle stops the daemons of groups no claim uses any more and sets new
// limits where the largest share changed; after releases, and at start for
// every daemon found (adopting those in use, stopping those a plugin that
// went away left behind). Failures are logged: a release has already
// succeeded, and the watcher tries again.
func (s *sharing) settle(ctx context.Context, all bool) {
	if s.mps == nil {
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
		dirs, err := s.mps.Known()
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
		g := s.node.Group(name)
		var err error
		switch {
		case !groupshare.UsesMPS(g):
			err = s.retire(ctx, name, g)
		case s.isDown(name):
			continue // halted for its lost GPU: watchDaemons starts it again
		case all:
			// At start: check that a daemon of a group in use still runs.
			err = s.mps.Ensure(ctx, s.hw.MPSGroup(g), s.want(ctx, g))
		default:
			err = s.mps.Settle(ctx, s.hw.MPSGroup(g), s.want(ctx, g))
		}
		if err != nil {
			klog.FromContext(ctx).Error(err, "Cannot settle MPS daemon", "mpsDaemon", name)
		}
	}
}

// retire settles the daemon of a group that does not use MPS today: one
// today's plan lacks (an earlier configuration's), or whose profile
// changed to timeSlicing. A claim that still holds the group keeps it (its
// containers are clients); the daemon stops after the last.
func (s *sharing) retire(ctx context.Context, name string, g *planner.Group) error {
	s.mu.Lock()
	delete(s.changed, name)
	s.mu.Unlock()
	if !s.mps.Has(name) {
		return nil
	}
	mg := mps.Group{Name: name} // its GPUs from its directory
	if g != nil {
		mg = s.hw.MPSGroup(g)
	}
	return s.mps.Retire(ctx, mg, s.held(ctx, name))
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
		dg := s.node.Group(dev.GroupDevice)
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
