package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// Sharing is how the shim applies the profiles' sharing strategies.
type Sharing struct {
	// Hardware runs the MPS daemons and sets time slices: the same the DRA
	// plugin would be given on this node (nodesetup.SharingFlags.Hardware);
	// nil refuses the seats of profiles that need either.
	Hardware *groupshare.Hardware
	// Assigned lists the devices the kubelet has assigned to the
	// containers of its active pods (its PodResources API). Required with
	// MPS: the device-plugin API never says a seat was released, so this
	// is where the shim learns that a group's last seat went.
	Assigned func(ctx context.Context) (podresources.Listing, error)
	// Self is the shim's own pod (namespace/name), when it runs in one. A
	// kubelet that has just started lists no pod, or only some, until it
	// has heard from the API server; a listing without the shim's own pod
	// is therefore not believed, and no daemon is stopped or lowered on
	// its word.
	Self string
	// Poll is how often the shim asks Assigned for released seats
	// (default 10s); a daemon stops at most this long after its group's
	// last pod.
	Poll time.Duration
	// Grace is how long a seat handed out counts as held while the
	// kubelet does not list it (default 10s). The kubelet records an
	// assignment as soon as Allocate returns, so a listing after that
	// shows it unless its pod is gone already (a pod refused after its
	// Allocate, or one whose containers all ended).
	Grace time.Duration
}

// shimSharing keeps each MPS group's daemon running while a container of
// an active pod holds one of its seats, with the largest share any such
// container holds; the same rule as the DRA plugin's, with the holders
// read from the kubelet instead of a ledger.
type shimSharing struct {
	Sharing
	hw *groupshare.Hardware
	// mps is hw's daemons, nil where the node runs none.
	mps *mps.Manager
	// groups are the layout's groups by device name; a seat ID is its
	// group's device name and "-seat-<n>".
	groups map[string]*planner.Group
	now    func() time.Time

	// listMu serialises listings, so that an older answer never replaces
	// a newer one.
	listMu sync.Mutex

	mu sync.Mutex
	// listed is the largest number of a group's seats one container
	// holds, by group device name, from the last believed listing; known:
	// there was one.
	listed map[string]int
	known  bool
	// pending are the hand-outs the kubelet did not list yet.
	pending []*handout
}

// handout is a container's seats of one group, handed out; at is when its
// Allocate answered (zero while it runs, when it does not expire).
type handout struct {
	group string
	ids   []string
	at    time.Time
}

func newShimSharing(s Sharing, inv *inventory.Inventory, layout *planner.Plan) (*shimSharing, error) {
	hw := s.Hardware
	if hw == nil {
		hw = &groupshare.Hardware{Inv: inv}
	}
	out := &shimSharing{Sharing: s, hw: hw, mps: hw.MPS, groups: map[string]*planner.Group{}, now: time.Now, listed: map[string]int{}}
	for _, g := range layout.Groups() {
		out.groups[g.DeviceName()] = g
	}
	if out.mps != nil && out.Assigned == nil {
		return nil, errors.New("MPS needs the kubelet's PodResources API: the shim learns there that a group's last seat was released")
	}
	if out.Poll <= 0 {
		out.Poll = 10 * time.Second
	}
	if out.Grace <= 0 {
		out.Grace = 10 * time.Second
	}
	return out, nil
}

// groupOfSeat is the group device name in a seat ID (g01-2x-seat-3: g01-2x).
func groupOfSeat(id string) (string, bool) {
	i := strings.LastIndex(id, "-seat-")
	if i <= 0 {
		return "", false
	}
	return id[:i], true
}

// prepare readies the group of a container's seats before the response
// names them: the interval of a time-sliced group, the daemon of an MPS
// group. It returns the MPS client edits, or nil for a group without MPS.
func (s *shimSharing) prepare(ctx context.Context, g *planner.Group, ids []string, groups int) (*containeredits.MPS, error) {
	if !groupshare.UsesMPS(g) {
		if err := s.hw.ApplyTimeSlice(ctx, g); err != nil {
			return nil, fmt.Errorf("group %s: %w", g.Name, err)
		}
		return nil, nil
	}
	if groups > 1 {
		return nil, fmt.Errorf("the container's seats are on %d groups, and a container reaches one MPS daemon only: ask for at most one group's seats of an MPS profile per container", groups)
	}
	if s.mps == nil {
		return nil, groupshare.ErrNoMPS(g)
	}
	h := &handout{group: g.DeviceName(), ids: slices.Clone(ids)}
	s.mu.Lock()
	s.pending = append(s.pending, h)
	s.mu.Unlock()
	// The grace period starts when the kubelet has the answer and can
	// record the assignment.
	defer func() {
		s.mu.Lock()
		h.at = s.now()
		s.mu.Unlock()
	}()
	// A fresh listing: the daemon's limits must not drop below the share
	// of a container that holds seats of this group and has not started
	// its CUDA process yet. A listing not believed leaves the last one.
	err := s.list(ctx)
	if errors.Is(err, errNotBelieved) && s.knows() {
		err = nil // the last believed listing stands
	}
	if err != nil {
		return nil, fmt.Errorf("group %s: cannot learn which of its seats are held, so cannot set its MPS limits: %w", g.Name, err)
	}
	if err := s.mps.Ensure(ctx, s.hw.MPSGroup(g), s.want(g)); err != nil {
		return nil, fmt.Errorf("group %s: %w", g.Name, err)
	}
	return s.hw.Client(g, len(ids))
}

// errNotBelieved is a listing that lacks the shim's own pod.
var errNotBelieved = errors.New("the kubelet does not list the shim's own pod yet, so it does not know all its pods (it has just started, or cannot reach the API server)")

func (s *shimSharing) knows() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known
}

// list reads the holders from the kubelet and drops the hand-outs it
// lists or that are older than the grace period.
func (s *shimSharing) list(ctx context.Context) error {
	s.listMu.Lock()
	defer s.listMu.Unlock()
	l, err := s.Assigned(ctx)
	if err != nil {
		return err
	}
	if s.Self != "" && !slices.Contains(l.Pods, s.Self) {
		return fmt.Errorf("%w: %s", errNotBelieved, s.Self)
	}
	largest := map[string]int{}
	var listed [][]string
	for _, a := range l.Assignments {
		perGroup := map[string]int{}
		for _, id := range a.IDs {
			if gd, ok := groupOfSeat(id); ok {
				perGroup[gd]++
			}
		}
		for gd, k := range perGroup {
			largest[gd] = max(largest[gd], k)
		}
		listed = append(listed, a.IDs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	klog.FromContext(ctx).V(4).Info("Listed the seats held", "largestHolder", largest, "pods", len(l.Pods), "pending", len(s.pending))
	s.listed, s.known = largest, true
	now := s.now()
	s.pending = slices.DeleteFunc(s.pending, func(h *handout) bool {
		return (!h.at.IsZero() && now.Sub(h.at) > s.Grace) || slices.ContainsFunc(listed, func(ids []string) bool { return sameSet(ids, h.ids) })
	})
	return nil
}

func sameSet(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(x string) bool { return !slices.Contains(b, x) })
}

// largest is the most seats of the group one holder has, listed or handed
// out since.
func (s *shimSharing) largest(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.listed[name]
	for _, h := range s.pending {
		if h.group == name {
			k = max(k, len(h.ids))
		}
	}
	return k
}

func (s *shimSharing) want(g *planner.Group) mps.Want {
	return func() (mps.Limits, bool, error) {
		limits, inUse := s.hw.Want(g, s.largest(g.DeviceName()))
		return limits, inUse, nil
	}
}

// run settles the daemons now and every Poll until ctx ends.
func (s *shimSharing) run(ctx context.Context) {
	if s.mps == nil {
		return
	}
	s.settle(ctx, true)
	t := time.NewTicker(s.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.settle(ctx, false)
		}
	}
}

// settle stops the daemons of groups no container holds and lowers the
// limits of those whose largest holder went. Daemons of groups the
// layout lacks (an earlier configuration's) are stopped once no container
// holds their seats. At start (all), a daemon of a group in use that went
// away is started again. While the kubelet cannot be asked, every daemon
// is left as it is.
func (s *shimSharing) settle(ctx context.Context, all bool) {
	logger := klog.FromContext(ctx)
	if err := s.list(ctx); err != nil {
		logger.Error(err, "Cannot learn which seats are held; MPS daemons are left as they are")
		return
	}
	names, err := s.mps.Known()
	if err != nil {
		logger.Error(err, "Cannot list MPS daemons")
	}
	for name, g := range s.groups {
		if groupshare.UsesMPS(g) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		g := s.groups[name]
		usesMPS := groupshare.UsesMPS(g)
		switch {
		case !usesMPS && s.largest(name) > 0:
			continue // a daemon of an earlier configuration, still held: it stays as it is
		case !usesMPS && g != nil:
			err = s.mps.Settle(ctx, s.hw.MPSGroup(g), mps.Unused())
		case !usesMPS:
			// A group today's layout lacks: stopped by its directory,
			// which names its GPUs.
			err = s.mps.Settle(ctx, mps.Group{Name: name}, mps.Unused())
		case all:
			err = s.mps.Ensure(ctx, s.hw.MPSGroup(g), s.want(g))
		default:
			err = s.mps.Settle(ctx, s.hw.MPSGroup(g), s.want(g))
		}
		if err != nil {
			logger.Error(err, "Cannot settle MPS daemon", "mpsDaemon", name)
		}
	}
}
