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
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
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
	// BootIDFile is read to tell a reboot.
	BootIDFile string
	Specs      Specs
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
	// CountError counts the ledger's failures that no call returns (a
	// failed flush, a lost checkpoint at start), by operation and kind.
	CountError func(operation, kind string)
	// Recovered is called when a checkpoint lost while the plugin ran (or
	// at a start the API server did not answer) was rebuilt: the rebuilt
	// claims' statuses are owed again. It must not call the ledger.
	Recovered func()
}

// Ledger is the record of the node's seats.
type Ledger struct {
	opts  Options
	index map[string]draresources.DeviceRef
	store *checkpoint.Store
	rec   recoverer

	// mu serialises every change of the record: batches of prepares,
	// releases, the start-up repair. st is the record in memory (nil: read
	// it from the file); told is what UsageChanged and operators were last
	// told; releasedWhileLost are the claims released while the checkpoint
	// was lost, which a rebuild must not bring back; baseline is what was
	// left of the lost checkpoint (its previous copy), whose generations
	// the rebuild keeps.
	mu                sync.Mutex
	st                *checkpoint.State
	told              told
	releasedWhileLost map[types.UID]bool
	baseline          *checkpoint.State
	// batch holds the prepares waiting for the next batch.
	batch batch
	// flushCh asks the flusher to make the last save durable; lostCh asks
	// the recoverer to rebuild a lost checkpoint.
	flushCh, lostCh chan struct{}
	// lost is set while the checkpoint is lost and not yet rebuilt.
	lost atomic.Bool
	// claims are the per-claim locks (claimlock.go); reloads counts the
	// times the record was read again from the file, which another writer
	// may have changed.
	claims  claimLocks
	reloads atomic.Uint64

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// batch is the queue of prepares waiting for a batch.
type batch struct {
	mu      sync.Mutex
	pending []*Reservation
}

// told is what the ledger last told of the claims' use: UsageChanged its
// usage (once known), operators the claims that fence GPUs.
type told struct {
	usage  Usage
	known  bool
	fences map[types.UID]fence
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
	l := &Ledger{
		opts: opts, index: draresources.Index(opts.Plan), store: checkpoint.NewStore(opts.Dir),
		releasedWhileLost: map[types.UID]bool{}, flushCh: make(chan struct{}, 1), lostCh: make(chan struct{}, 1), cancel: cancel,
	}
	l.rec = recoverer{opts: &l.opts, index: l.index}
	l.wg.Go(func() { l.flush(ctx) })
	l.wg.Go(func() { l.recoverWhenLost(ctx) })
	if err := l.repair(ctx); err != nil {
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
	if err := l.store.Sync(); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot flush the checkpoint to disk at stop")
	}
}

// Lost reports whether the checkpoint is lost and not rebuilt yet.
func (l *Ledger) Lost() bool { return l.lost.Load() }

// StatusOwed is the entry of a recorded claim whose status may lack its
// seats, or nil. An entry's devices never change once recorded, so the
// caller may read them without the lock.
func (l *Ledger) StatusOwed(uid types.UID) *checkpoint.Claim {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == nil {
		return nil
	}
	// A fenced claim has no seats to record.
	if c := l.st.Claims[uid]; c != nil && !c.StatusWritten && !c.Fenced() {
		return c
	}
	return nil
}

// Prepared are the recorded claims whose prepare completed. Entries'
// devices never change once recorded, so the caller may read them without
// the lock.
func (l *Ledger) Prepared() []*checkpoint.Claim {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == nil {
		return nil
	}
	var out []*checkpoint.Claim
	for _, c := range l.st.Claims {
		if c.Phase == checkpoint.PrepareCompleted {
			out = append(out, c)
		}
	}
	return out
}

// PreparedUIDs are the UIDs of the recorded claims, in any phase.
func (l *Ledger) PreparedUIDs() []types.UID {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == nil {
		return nil
	}
	out := make([]types.UID, 0, len(l.st.Claims))
	for uid := range l.st.Claims {
		out = append(out, uid)
	}
	return out
}

// MarkStatusWritten notes that c's status holds its seats, if c is still
// the claim's entry. The next save keeps it.
func (l *Ledger) MarkStatusWritten(uid types.UID, c *checkpoint.Claim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st != nil && l.st.Claims[uid] == c {
		c.StatusWritten = true
	}
}

// StatusesOwed are the recorded claims whose status may lack their seats.
func (l *Ledger) StatusesOwed() []types.UID {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == nil {
		return nil
	}
	var out []types.UID
	for uid, c := range l.st.Claims {
		if !c.StatusWritten && c.Phase == checkpoint.PrepareCompleted && !c.Fenced() {
			out = append(out, uid)
		}
	}
	return out
}

// lock takes the ledger's lock and then the file lock shared with the
// other pod of a rolling update; the func it returns releases both.
func (l *Ledger) lock() (func(), error) {
	l.mu.Lock()
	unlock, err := l.lockFile()
	if err != nil {
		l.mu.Unlock()
		return nil, err
	}
	return func() { unlock(); l.mu.Unlock() }, nil
}

// lockFile takes the lock that serialises the two instances of a rolling
// update around every change of the checkpoint; it is the lock the
// kubeletplugin helper of an instance that serialises its calls takes.
// Without a peer, l.mu alone suffices.
func (l *Ledger) lockFile() (func(), error) {
	if !l.opts.SharedWithPeer {
		return func() {}, nil
	}
	lock, err := fileutil.LockFile(filepath.Join(l.opts.Dir, "serialize.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the plugin data directory: %w", err)
	}
	return func() { _ = lock.Close() }, nil
}

// errLost fails what needs the record while the checkpoint is lost.
var errLost = errors.New("the plugin's checkpoint is lost and not rebuilt yet")

// state is the record in memory, read again from the file when another
// writer replaced it (the other instance of a rolling update). A file
// that cannot be trusted now (damaged, gone, or its previous copy behind
// the specs on the node) makes the checkpoint lost: errLost, and a
// rebuild in the background. Call with the lock held.
func (l *Ledger) state(ctx context.Context) (*checkpoint.State, error) {
	if l.lost.Load() {
		return nil, errLost
	}
	if l.st != nil && !l.store.Changed() {
		return l.st, nil
	}
	st, res, err := l.store.Load()
	l.reloads.Add(1)
	if errors.Is(err, checkpoint.ErrCorrupt) {
		l.countError("prepare", "checkpoint")
		l.enterLost(ctx, fmt.Errorf("the checkpoint and its previous copy are unusable: %w", err), nil)
		return nil, errLost
	}
	if err != nil {
		return nil, fmt.Errorf("read the checkpoint: %w", err)
	}
	if doubt := l.doubt(st, res); doubt != nil {
		l.countError("prepare", "checkpoint")
		l.enterLost(ctx, doubt, st)
		return nil, errLost
	}
	if res.RecoveredFrom != nil {
		if err := l.continueFromPrevious(ctx, st, res.RecoveredFrom); err != nil {
			return nil, err
		}
	}
	l.st = st
	l.noteUsage(ctx, st)
	return st, nil
}

// save writes st as the checkpoint, makes it the record in memory and asks
// the flusher to make it durable. Call with the lock held.
func (l *Ledger) save(ctx context.Context, st *checkpoint.State) error {
	if err := l.store.Save(st); err != nil {
		return err
	}
	l.st = st
	l.noteUsage(ctx, st)
	select {
	case l.flushCh <- struct{}{}:
	default:
	}
	return nil
}

func (l *Ledger) countError(operation, kind string) {
	if l.opts.CountError != nil {
		l.opts.CountError(operation, kind)
	}
}

func run(hook func()) {
	if hook != nil {
		hook()
	}
}
