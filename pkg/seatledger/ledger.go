// Package seatledger is the DRA plugin's record of which claim holds which
// seats of the node's groups: the choice of seats, the checkpoint that
// keeps it in memory and on disk, and what makes the record true again
// after a crash, a reboot or the loss of the checkpoint. It is the one
// place that decides a seat is taken, so the node never hands one out
// twice.
//
// Why it is shaped so:
//
//   - The checkpoint is kept in memory and saved once per batch: prepares
//     that arrive while a batch is being recorded wait for the next one, so
//     concurrent claims share one write. A save is an atomic rename, safe
//     against the plugin crashing; a flusher makes it durable against a
//     power loss right behind it, off the path of the call that needed it.
//   - What a power loss can still take (the last milliseconds of saves) is
//     repaired at the next start: the kubelet prepares every claim again
//     after a reboot, the generation floor is raised above anything handed
//     out before, and held claims are checked against the API server.
//   - Both copies of the checkpoint lost: the record is rebuilt from the
//     API server; until it is, new claims are refused and releases work.
//   - Two plugin pods serve a node during a rolling update: every change of
//     the checkpoint takes a file lock shared with the other pod, and the
//     record is read again when the other pod replaced the file.
//
// The ledger writes no CDI spec on the prepare path (the plugin does, after
// the seats are recorded), but it keeps the specs in step with its record
// at start, after a loss, and when it releases a claim.
package seatledger

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// Specs are the CDI specs of the claims the ledger records: what a
// container runtime reads. The ledger keeps them in step with its record.
type Specs interface {
	// Exists reports whether the claim's spec is on disk.
	Exists(uid types.UID) bool
	// Complete reports whether every spec the claim's prepare named is on
	// disk: its own, and those written beside it (its device metadata's).
	Complete(uid types.UID, c *checkpoint.Claim) bool
	// Write writes the claim's spec from its entry alone, and what of the
	// specs written beside it is missing.
	Write(uid types.UID, c *checkpoint.Claim) error
	// Remove removes the claim's spec and those written beside it, with
	// the files they bring into containers; a missing one is no error.
	// claim is the claim's name where the ledger knows it (else zero).
	Remove(uid types.UID, claim types.NamespacedName) error
	// Claims lists the claims that have a spec, and the files that look
	// like specs but are not the plugin's (skipped).
	Claims() (uids []types.UID, skipped []string, err error)
	// ReadEnv reads a claim's spec back: each CDI device's environment,
	// by device name; ok is false when the claim has no spec.
	ReadEnv(uid types.UID) (env map[string]map[string]string, ok bool, err error)
}

// Hooks, for tests only, are called at the ledger's steps, so that a test
// can stop the plugin there (crash-point injection).
type Hooks struct {
	// BeforeSave and AfterSave surround the save that records a batch's
	// seats.
	BeforeSave, AfterSave func()
	// AfterSpecRemove follows the removal of a released claim's spec;
	// AfterReleaseSave the save that drops the released claims.
	AfterSpecRemove, AfterReleaseSave func()
}

// Options configure a ledger. Pool, Plan, Inventory, Dir, Specs, Claims
// and Clock are required.
type Options struct {
	// Pool is the node's pool: a claim allocated from another is refused.
	Pool      string
	Plan      *planner.Plan
	Inventory *inventory.Inventory
	// Dir holds the checkpoint, and the lock file shared with the other
	// pod of a rolling update.
	Dir string
	// SharedWithPeer says another plugin instance may change the
	// checkpoint (rolling updates): every change takes the file lock.
	SharedWithPeer bool
	// BootID is the node's boot (package bootid): a checkpoint written in
	// another boot tells a reboot.
	BootID string
	Specs  Specs
	// Claims reads ResourceClaims: to rebuild a lost checkpoint and to find
	// held claims the API server no longer allocates here.
	Claims resourceclient.ResourceClaimsGetter
	Events *nodeevents.Recorder
	Clock  clock.WithTicker
	Hooks  Hooks
	// UsageChanged is told what the held claims use whenever it changes
	// (the plugin publishes again). It is called with the ledger's lock
	// held: it must not call the ledger.
	UsageChanged func(Usage)
	// Feed, if set, is kept told of what the held claims use, for the
	// parts that read it when they decide (the MPS daemons).
	Feed *UsageFeed
	// CountError counts the ledger's failures that no call returns (a
	// failed flush, a lost checkpoint at start), by operation and kind.
	CountError func(operation, kind string)
	// Recovered is called when a checkpoint lost while the plugin ran (or
	// at a start the API server did not answer) was rebuilt: the rebuilt
	// claims' statuses are owed again. It must not call the ledger.
	Recovered func()
}

// Ledger is the record of the node's seats. It answers the plugin's calls
// and hands each responsibility to a type of its own: the checkpoint and
// its locks (record), the choice of seats (assigner) and the batching of
// prepares (batcher), the release of claims the API server no longer
// allocates here (staleReleaser), and the repair of the node at start and
// after a loss (repairer).
type Ledger struct {
	opts    Options
	rec     *record
	batches *batcher
	stale   *staleReleaser
	repair  *repairer
	// claims are the per-claim locks (claimlock.go).
	claims *claimLocks

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Open reads the checkpoint and repairs the node's state before the
// kubelet can call: the specs of recorded claims are written where
// missing, specs no claim owns are removed, and a lost checkpoint is
// rebuilt from the API server (or, while it does not answer, in the
// background). Close ends it.
func Open(ctx context.Context, opts Options) (*Ledger, error) {
	switch {
	case opts.Pool == "" || opts.Plan == nil || opts.Inventory == nil || opts.Dir == "":
		return nil, errors.New("seat ledger: the pool, the plan, the inventory and the directory are required")
	case opts.Specs == nil || opts.Claims == nil || opts.Clock == nil:
		return nil, errors.New("seat ledger: the specs, a claims client and a clock are required")
	}
	ctx, cancel := context.WithCancel(ctx)
	l := &Ledger{opts: opts, claims: &claimLocks{}, cancel: cancel}
	index := draresources.Index(opts.Plan)
	rc := &recoverer{opts: &l.opts, index: index}
	l.rec = newRecord(&l.opts, rc)
	l.batches = &batcher{rec: l.rec, specs: opts.Specs, hooks: opts.Hooks,
		assign: assigner{pool: opts.Pool, plan: opts.Plan, inventory: opts.Inventory, index: index}}
	l.stale = &staleReleaser{rec: l.rec, claims: l.claims, client: opts.Claims, pool: opts.Pool, specs: opts.Specs, events: opts.Events}
	l.repair = &repairer{rec: l.rec, rc: rc, opts: &l.opts}
	if opts.Feed != nil {
		// Before the repair below tells it the record's use.
		opts.Feed.attach(l)
	}
	l.wg.Go(func() { l.rec.flush(ctx) })
	l.wg.Go(func() { l.repair.recoverWhenLost(ctx) })
	if err := l.repair.atOpen(ctx); err != nil {
		l.Close(ctx)
		return nil, err
	}
	return l, nil
}

// Close stops the ledger's background work and flushes the checkpoint to
// disk.
func (l *Ledger) Close(ctx context.Context) {
	l.cancel()
	l.wg.Wait()
	if err := l.rec.store.Sync(); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot flush the checkpoint to disk at stop")
	}
}

// Lost reports whether the checkpoint is lost and not rebuilt yet.
func (l *Ledger) Lost() bool { return l.rec.lost.Load() }

// StatusOwed is the entry of a recorded claim whose status may lack its
// seats, or nil. An entry's devices never change once recorded, so the
// caller may read them without the lock.
func (l *Ledger) StatusOwed(uid types.UID) *checkpoint.Claim {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	if l.rec.st == nil {
		return nil
	}
	// A fenced claim has no seats to record.
	if c := l.rec.st.Claims[uid]; c != nil && !c.StatusWritten && !c.Fenced() {
		return c
	}
	return nil
}

// Prepared are the recorded claims whose prepare completed. Entries'
// devices never change once recorded, so the caller may read them without
// the lock.
func (l *Ledger) Prepared() []*checkpoint.Claim {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	if l.rec.st == nil {
		return nil
	}
	var out []*checkpoint.Claim
	for _, c := range l.rec.st.Claims {
		if c.Phase == checkpoint.PrepareCompleted {
			out = append(out, c)
		}
	}
	return out
}

// PreparedClaims are the recorded claims whose prepare completed, by
// UID. Entries' devices never change once recorded, so the caller may
// read them without the lock.
func (l *Ledger) PreparedClaims() map[types.UID]*checkpoint.Claim {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	out := map[types.UID]*checkpoint.Claim{}
	if l.rec.st == nil {
		return out
	}
	for uid, c := range l.rec.st.Claims {
		if c.Phase == checkpoint.PrepareCompleted {
			out[uid] = c
		}
	}
	return out
}

// PreparedUIDs are the UIDs of the recorded claims, in any phase.
func (l *Ledger) PreparedUIDs() []types.UID {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	if l.rec.st == nil {
		return nil
	}
	out := make([]types.UID, 0, len(l.rec.st.Claims))
	for uid := range l.rec.st.Claims {
		out = append(out, uid)
	}
	return out
}

// MarkStatusWritten notes that c's status holds its seats, if c is still
// the claim's entry. The next save keeps it.
func (l *Ledger) MarkStatusWritten(uid types.UID, c *checkpoint.Claim) {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	if l.rec.st != nil && l.rec.st.Claims[uid] == c {
		c.StatusWritten = true
	}
}

// StatusesOwed are the recorded claims whose status may lack their seats.
func (l *Ledger) StatusesOwed() []types.UID {
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	if l.rec.st == nil {
		return nil
	}
	var out []types.UID
	for uid, c := range l.rec.st.Claims {
		if !c.StatusWritten && c.Phase == checkpoint.PrepareCompleted && !c.Fenced() {
			out = append(out, uid)
		}
	}
	return out
}

func run(hook func()) {
	if hook != nil {
		hook()
	}
}
