// Package sharedseats is the kind of seat that is a share of a whole-GPU
// group (seatkind.Kind): a seat time-sliced with the group's other seats
// (TimeSliced), or a client of the group's MPS daemon, limited to its
// share (MPS). The hardware side of both (the daemon of a group, the
// time slice of its GPUs, what a client gets) is package groupshare's,
// the same for the device-plugin shim; what is the DRA plugin's is when
// a daemon runs, with which limits, and when it stops: that follows the
// seat ledger's claims.
package sharedseats

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatkind"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

// Options configure the shared seats. Hardware and WatchInterval are the
// operator's (the plugin's options); the plugin fills in the rest.
type Options struct {
	// Hardware runs the MPS daemons and sets time slices
	// (nodesetup.SharingFlags.Hardware); nil refuses the claims of
	// profiles that need either.
	Hardware *groupshare.Hardware
	// WatchInterval is how often the daemons of groups in use are checked
	// (default 5s): one that ended is started again. The check reads
	// /proc; no daemon is asked anything.
	WatchInterval time.Duration

	Node draresources.Node
	// Usage is what the held claims use (the seat ledger's feed).
	Usage Usage
	// Events and Registry report daemons started again by the watcher.
	Events   *nodeevents.Recorder
	Registry prometheus.Registerer
}

// Usage is what the held claims use, as the seat ledger tells it
// (seatledger.UsageFeed).
type Usage interface {
	// Last is what the ledger told last; known is false until it told (a
	// lost checkpoint not rebuilt yet).
	Last() (u seatledger.Usage, known bool)
	// Fresh reads the checkpoint again first where another plugin
	// instance shares it (a rolling update).
	Fresh(ctx context.Context) (seatledger.Usage, error)
}

// MPS keeps each group in use sharing its GPUs through its MPS daemon:
// the daemon of a group runs from the prepare of its first seat to the
// release of its last, holding the largest share a claim has there.
//
// Which claims hold a group is the ledger's. Where another plugin instance
// serves the node too (a rolling update), each instance's ledger knows the
// other's claims only once it reads the checkpoint again, so every
// decision about a daemon (start, limits, stop) reads it first (Fresh),
// under the daemon's own lock: an instance never stops, or lowers, a
// daemon a claim of the other needs.
type MPS struct {
	opts Options
	hw   *groupshare.Hardware
	// mps is hw's daemons, nil where the node runs none.
	mps *mps.Manager
	// restarts counts daemons started again by the watcher.
	restarts *prometheus.CounterVec

	mu sync.Mutex
	// settled is, per group, the largest share its daemon was last
	// settled for: a group whose largest share differs is settled after
	// a release.
	settled map[string]share
	// down are the MPS groups with a lost GPU, whose daemons are halted
	// until the GPU comes back.
	down map[string]bool

	// failing are the groups whose daemon the watcher keeps failing to
	// settle (its goroutine's alone).
	failing map[string]*watchFailure
}

var _ seatkind.Kind = (*MPS)(nil)

// NewMPS returns the MPS seats of a node.
func NewMPS(opts Options) (*MPS, error) {
	if opts.WatchInterval <= 0 {
		opts.WatchInterval = 5 * time.Second
	}
	hw := hardware(opts)
	s := &MPS{opts: opts, hw: hw, mps: hw.MPS, settled: map[string]share{}, down: map[string]bool{}, failing: map[string]*watchFailure{},
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kyb_mps_daemon_restarts_total", Help: "MPS control daemons started again after they ended while their group was in use, by group.",
		}, []string{"group"})}
	if err := opts.Registry.Register(s.restarts); err != nil {
		return nil, fmt.Errorf("register the MPS metrics: %w", err)
	}
	return s, nil
}

// hardware is opts' hardware, or none: no daemons, no time slices.
func hardware(opts Options) *groupshare.Hardware {
	if opts.Hardware != nil {
		return opts.Hardware
	}
	return &groupshare.Hardware{Inv: opts.Node.Inv}
}

// share is the largest share the claims on a group hold: the most seats
// of an equal share one claim holds, and the most memory and compute one
// claim's sized seats hold. Both are held only where a configuration
// changed whether the group is sized under held claims.
type share struct {
	seats int
	size  v1alpha1.SeatSize
}

func shareOf(u seatledger.Usage, name string) share {
	return share{seats: u.Largest[name], size: u.Sizes[name]}
}

func (sh share) inUse() bool { return sh.seats > 0 || !sh.size.IsZero() }

// want is what g's daemon must hold now: the largest share a claim holds
// there, read afresh.
func (s *MPS) want(ctx context.Context, g *planner.Group) mps.Want {
	return func() (mps.Limits, bool, error) {
		sh, err := s.largest(ctx, g.DeviceName())
		if err != nil {
			return mps.Limits{}, false, err
		}
		limits, _ := s.hw.Want(g, sh.seats)
		if !sh.size.IsZero() {
			limits = mps.Max(limits, s.hw.Sized(g, sh.size))
		}
		return limits, sh.inUse(), nil
	}
}

// held tells whether a claim holds the group: while one does, the daemon
// of a group that no longer uses MPS stays for its containers.
func (s *MPS) held(ctx context.Context, name string) func() (bool, error) {
	return func() (bool, error) {
		sh, err := s.largest(ctx, name)
		return sh.inUse(), err
	}
}

// largest is the largest share a claim holds of the group now, noted as
// what its daemon is settled for.
func (s *MPS) largest(ctx context.Context, name string) (share, error) {
	u, err := s.opts.Usage.Fresh(ctx)
	if err != nil {
		return share{}, fmt.Errorf("read which claims hold group %s from the checkpoint shared with the other plugin instance: %w", name, err)
	}
	sh := shareOf(u, name)
	s.mu.Lock()
	s.settled[name] = sh
	s.mu.Unlock()
	return sh, nil
}

func (s *MPS) isDown(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down[name]
}

// Prepare has the MPS daemons of a claim's groups answer with the claim's
// share before its spec is written. A failure fails this claim only.
func (s *MPS) Prepare(ctx context.Context, _ types.UID, c *checkpoint.Claim) error {
	for _, dev := range c.Devices {
		g := s.opts.Node.Group(dev.GroupDevice)
		if dev.AdminAccess || !groupshare.UsesMPS(g) {
			continue // admin access is monitoring: NVML, not an MPS client
		}
		if s.mps == nil {
			return seatkind.Failed(seatkind.ErrSharing, groupshare.ErrNoMPS(g))
		}
		if err := s.mps.Ensure(ctx, s.hw.MPSGroup(g), s.want(ctx, g)); err != nil {
			return seatkind.Failed(seatkind.ErrSharing, fmt.Errorf("group %s: %w", g.Name, err))
		}
	}
	return nil
}

// Edit makes a request's container a client of its group's daemon, where
// its groups use MPS. A container reaches one daemon only (one
// CUDA_MPS_PIPE_DIRECTORY), so a request holding seats of an MPS group
// holds seats of that group only. The client's share is the request's
// seats of the group's, or on a sized group the sizes of its seats added
// up: computed here once per spec, and what the request's device metadata
// says.
func (s *MPS) Edit(_ types.UID, req seatkind.Request) error {
	var g *planner.Group
	var size v1alpha1.SeatSize
	k := 0
	usesMPS := false
	for _, dev := range req.Devices {
		dg := s.opts.Node.Group(dev.GroupDevice)
		if dg == nil || dev.AdminAccess {
			continue
		}
		if dg.Profile.Sharing == v1alpha1.SharingMPS {
			usesMPS = true
		}
		if g != nil && dg != g && usesMPS {
			return fmt.Errorf("the request holds seats of groups %s and %s, and a container reaches one MPS daemon only: request seats of one MPS group per request", g.Name, dg.Name)
		}
		g = dg
		k += len(dev.Seats)
		if dev.Size != nil {
			size = size.Add(*dev.Size)
		}
	}
	if !usesMPS || k == 0 {
		return nil
	}
	limits := s.hw.Share(g, k)
	if !size.IsZero() {
		limits = s.hw.Sized(g, size)
	}
	client, err := s.hw.ClientWith(g, limits)
	if err != nil {
		return err
	}
	req.Options.MPS = client
	return nil
}

// Verify finds nothing gone: a daemon that ended is started again by the
// watcher, whatever prepares come.
func (s *MPS) Verify(context.Context, types.UID, *checkpoint.Claim, bool) []string { return nil }

// Release leaves the daemons to Released: whether one stops depends on
// the seats still held once these are freed.
func (s *MPS) Release(context.Context, []types.UID) map[types.UID]error { return nil }

// Released settles the daemons whose group's largest share changed:
// stopped where no claim holds the group any more, lowered where the
// largest share went.
func (s *MPS) Released(ctx context.Context, _ []types.UID) { s.Settle(ctx, false) }

// Settle stops the daemons of groups no claim uses any more and sets new
// limits where the largest share changed; after releases, and with all
// at start and after a lost checkpoint was rebuilt, for every daemon
// found (adopting those in use, stopping those a plugin that went away
// left behind). Failures are logged: a release has already succeeded,
// and the watcher tries again.
func (s *MPS) Settle(ctx context.Context, all bool) {
	if s.mps == nil {
		return
	}
	u, known := s.opts.Usage.Last()
	if !known {
		klog.FromContext(ctx).Info("Which groups are in use is not known yet (the checkpoint is being rebuilt); MPS daemons are left as they are")
		return
	}
	s.mu.Lock()
	var names []string
	for _, gd := range slices.Concat(slices.Collect(maps.Keys(s.settled)), u.InUse()) {
		if s.settled[gd] != shareOf(u, gd) {
			names = append(names, gd)
		}
	}
	s.mu.Unlock()
	if all {
		dirs, err := s.mps.Known()
		if err != nil {
			klog.FromContext(ctx).Error(err, "Cannot list MPS daemons")
		}
		names = append(append(names, dirs...), u.InUse()...)
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		g := s.opts.Node.Group(name)
		var err error
		switch {
		case !groupshare.UsesMPS(g):
			err = s.retire(ctx, name, g)
		case s.isDown(name):
			continue // halted for its lost GPU: the watcher starts it again
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
func (s *MPS) retire(ctx context.Context, name string, g *planner.Group) error {
	u, _ := s.opts.Usage.Last()
	s.mu.Lock()
	s.settled[name] = shareOf(u, name)
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

// TimeSliced applies a timeSlicing profile's interval to the GPUs of a
// group before its seats are used; seats of a profile without one share
// the GPUs as the driver's default has them.
type TimeSliced struct {
	node draresources.Node
	hw   *groupshare.Hardware
}

var _ seatkind.Kind = (*TimeSliced)(nil)

// NewTimeSliced returns the time-sliced seats of a node.
func NewTimeSliced(opts Options) *TimeSliced {
	return &TimeSliced{node: opts.Node, hw: hardware(opts)}
}

// Prepare sets the time slice of a claim's time-sliced groups.
func (t *TimeSliced) Prepare(ctx context.Context, _ types.UID, c *checkpoint.Claim) error {
	for _, dev := range c.Devices {
		g := t.node.Group(dev.GroupDevice)
		if dev.AdminAccess || g == nil || groupshare.UsesMPS(g) || g.Profile.TimeSlice == "" {
			continue
		}
		if err := t.hw.ApplyTimeSlice(ctx, g); err != nil {
			return seatkind.Failed(seatkind.ErrSharing, fmt.Errorf("group %s: %w", g.Name, err))
		}
	}
	return nil
}

// Edit adds nothing: a time-sliced seat's container sees its group's GPUs
// as any seat's does.
func (t *TimeSliced) Edit(types.UID, seatkind.Request) error { return nil }

// Verify finds nothing gone.
func (t *TimeSliced) Verify(context.Context, types.UID, *checkpoint.Claim, bool) []string { return nil }

// Release has nothing to undo: the interval stays on the GPUs.
func (t *TimeSliced) Release(context.Context, []types.UID) map[types.UID]error { return nil }

// Released has nothing to let go of.
func (t *TimeSliced) Released(context.Context, []types.UID) {}
