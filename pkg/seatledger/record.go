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
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// record is the checkpoint as the ledger keeps it: the state in memory,
// the file it is saved to, the locks every change takes, and whether it is
// lost. Whatever reads or changes the seats goes through it; what
// decides them (assigner, batcher), releases them (staleReleaser) or
// makes them true again after a loss (repairer) holds it.
type record struct {
	opts  *Options
	store *checkpoint.Store
	// rc checks a state loaded from the previous copy of the file against
	// the specs on the node.
	rc *recoverer

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
	// flushCh asks the flusher to make the last save durable; lostCh asks
	// the repairer to rebuild a lost checkpoint.
	flushCh, lostCh chan struct{}
	// lost is set while the checkpoint is lost and not yet rebuilt.
	lost atomic.Bool
	// reloads counts the times the record was read again from the file,
	// which another writer may have changed.
	reloads atomic.Uint64
}

// told is what the ledger last told of the claims' use: UsageChanged its
// usage (once known), operators the claims that fence GPUs.
type told struct {
	usage  Usage
	known  bool
	fences map[types.UID]fence
}

func newRecord(opts *Options, rc *recoverer) *record {
	return &record{
		opts: opts, store: checkpoint.NewStore(opts.Dir), rc: rc,
		releasedWhileLost: map[types.UID]bool{}, flushCh: make(chan struct{}, 1), lostCh: make(chan struct{}, 1),
	}
}

// lock takes the record's lock and then the file lock shared with the
// other pod of a rolling update; the func it returns releases both.
func (r *record) lock() (func(), error) {
	r.mu.Lock()
	unlock, err := r.lockFile()
	if err != nil {
		r.mu.Unlock()
		return nil, err
	}
	return func() { unlock(); r.mu.Unlock() }, nil
}

// lockFile takes the lock that serialises the two instances of a rolling
// update around every change of the checkpoint; it is the lock the
// kubeletplugin helper of an instance that serialises its calls takes.
// Without a peer, r.mu alone suffices.
func (r *record) lockFile() (func(), error) {
	if !r.opts.SharedWithPeer {
		return func() {}, nil
	}
	lock, err := fileutil.LockFile(filepath.Join(r.opts.Dir, "serialize.lock"), os.O_RDWR|os.O_CREATE, 0o600)
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
func (r *record) state(ctx context.Context) (*checkpoint.State, error) {
	if r.lost.Load() {
		return nil, errLost
	}
	if r.st != nil && !r.store.Changed() {
		return r.st, nil
	}
	st, res, err := r.store.Load()
	r.reloads.Add(1)
	if errors.Is(err, checkpoint.ErrCorrupt) {
		r.countError("prepare", "checkpoint")
		r.enterLost(ctx, fmt.Errorf("the checkpoint and its previous copy are unusable: %w", err), nil)
		return nil, errLost
	}
	if err != nil {
		return nil, fmt.Errorf("read the checkpoint: %w", err)
	}
	if doubt := r.doubt(st, res); doubt != nil {
		r.countError("prepare", "checkpoint")
		r.enterLost(ctx, doubt, st)
		return nil, errLost
	}
	if res.RecoveredFrom != nil {
		if err := r.continueFromPrevious(ctx, st, res.RecoveredFrom); err != nil {
			return nil, err
		}
	}
	r.st = st
	r.noteUsage(ctx, st)
	return st, nil
}

// save writes st as the checkpoint, makes it the record in memory and asks
// the flusher to make it durable. Call with the lock held.
func (r *record) save(ctx context.Context, st *checkpoint.State) error {
	if err := r.store.Save(st); err != nil {
		return err
	}
	r.st = st
	r.noteUsage(ctx, st)
	select {
	case r.flushCh <- struct{}{}:
	default:
	}
	return nil
}

// doubt says why a state loaded from the previous copy of the checkpoint,
// or a fresh one where no checkpoint was found, cannot stand for the
// checkpoint; nil if it can. Either may be behind what the node gave
// containers: the previous copy lacks the last save, and a checkpoint
// deleted with its copy looks like a first start. What containers were
// given is in the specs on the node, so the state stands when it records
// every spec, with the seats the spec gives. A claim the lost save
// released only holds its seats a little longer (ReleaseStale frees
// them); one the lost save prepared before its spec was written was given
// to no container, and the kubelet prepares it again.
func (r *record) doubt(st *checkpoint.State, res checkpoint.LoadResult) error {
	var what string
	switch {
	case res.Fresh:
		what = "no checkpoint exists"
	case res.RecoveredFrom != nil:
		what = fmt.Sprintf("the checkpoint is unusable (%v) and its previous copy is behind the node", res.RecoveredFrom)
	default:
		return nil
	}
	if err := r.specsRecorded(st); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// specsRecorded checks that st records every claim that has a spec on the
// node, with the seats its spec gives.
func (r *record) specsRecorded(st *checkpoint.State) error {
	uids, _, err := r.opts.Specs.Claims()
	if err != nil {
		return fmt.Errorf("the CDI specs cannot be listed to check it against: %w", err)
	}
	for _, uid := range uids {
		c := st.Claims[uid]
		if c == nil {
			return fmt.Errorf("claim %s has a CDI spec on the node but no entry", uid)
		}
		if err := r.rc.specAgrees(uid, c); err != nil {
			return fmt.Errorf("claim %s/%s (%s): %w", c.Namespace, c.Name, uid, err)
		}
	}
	return nil
}

// continueFromPrevious makes the previous copy of the checkpoint, found to
// record every spec on the node, the checkpoint again: the unusable file
// is set aside for diagnosis and the copy saved in its place. Call with
// the lock held.
func (r *record) continueFromPrevious(ctx context.Context, st *checkpoint.State, cause error) error {
	klog.FromContext(ctx).Error(cause, "Checkpoint was unusable; continuing from its previous copy, which records every claim that has a CDI spec on the node")
	r.countError("prepare", "checkpoint")
	if err := r.store.Quarantine(); err != nil {
		return err
	}
	if err := r.save(ctx, st); err != nil {
		return fmt.Errorf("rewrite the checkpoint from its previous copy: %w", err)
	}
	return nil
}

// enterLost makes the checkpoint lost: new claims are refused, releases
// go on, and the repairer rebuilds it as soon as the API server answers.
// Call with the lock held.
func (r *record) enterLost(ctx context.Context, cause error, baseline *checkpoint.State) {
	klog.FromContext(ctx).Error(cause, "The checkpoint cannot be trusted; new claims are refused until it is rebuilt from the API server")
	if !r.lost.Load() {
		r.opts.Events.Warning(ctx, nodeevents.ReasonCheckpointLost, fmt.Sprintf("The plugin's checkpoint cannot be trusted (%v); new claims on this node are refused until it is rebuilt from the API server", cause))
	}
	r.st, r.baseline = nil, baseline
	r.lost.Store(true)
	select {
	case r.lostCh <- struct{}{}:
	default:
	}
}

func (r *record) countError(operation, kind string) {
	if r.opts.CountError != nil {
		r.opts.CountError(operation, kind)
	}
}
