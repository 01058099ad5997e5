package draplugin

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// The plugin keeps the checkpoint in memory and writes it once per batch:
// prepares that arrive while a batch is being recorded wait for the next
// one, so concurrent claims share one write. A save is an atomic rename,
// safe against the plugin crashing; the flusher makes it durable against a
// power loss right behind it, off the call's path. What a power loss can
// still take (the last milliseconds of saves) is repaired at the next
// start: the kubelet prepares every claim again after a reboot, the
// generation floor is raised above anything handed out before, and held
// claims are checked against the API server (verify.go).

// reservation is one prepare call's claims in a batch, and what the batch
// decided for them.
type reservation struct {
	claims []*resourceapi.ResourceClaim
	// entries are the claims' checkpoint entries: recorded by this batch
	// (fresh) or before.
	entries map[types.UID]*checkpoint.Claim
	fresh   map[types.UID]bool
	// errs fail single claims; err fails the call.
	errs map[types.UID]error
	err  error
	done bool
}

// reserve records seats for those of claims that hold none yet, in one
// checkpoint save with every other prepare waiting at the same time.
func (d *Driver) reserve(ctx context.Context, claims []*resourceapi.ResourceClaim) *reservation {
	r := &reservation{claims: claims}
	d.pendingMu.Lock()
	d.pending = append(d.pending, r)
	d.pendingMu.Unlock()

	d.mu.Lock()
	defer d.mu.Unlock()
	if r.done {
		// An earlier holder of d.mu took this reservation into its batch.
		return r
	}
	d.pendingMu.Lock()
	batch := d.pending
	d.pending = nil
	d.pendingMu.Unlock()
	d.reserveBatch(ctx, batch)
	return r
}

// reserveBatch decides the seats of a batch of reservations and saves
// them once. Call with d.mu held.
func (d *Driver) reserveBatch(ctx context.Context, batch []*reservation) {
	logger := klog.FromContext(ctx)
	fail := func(err error) {
		for _, r := range batch {
			r.err, r.done = err, true
		}
	}
	unlock, err := d.lockFile()
	if err != nil {
		fail(err)
		return
	}
	defer unlock()
	st, err := d.state(ctx)
	if err != nil {
		fail(err)
		return
	}
	changed := false
	for _, r := range batch {
		r.done = true
		r.entries, r.fresh, r.errs = map[types.UID]*checkpoint.Claim{}, map[types.UID]bool{}, map[types.UID]error{}
		for _, claim := range r.claims {
			if c, ok := st.Claims[claim.UID]; ok && c.Phase == checkpoint.PrepareCompleted {
				r.entries[claim.UID] = c
				continue
			}
			c, err := d.assignSeats(st, claim)
			if err != nil {
				d.metrics.prepareError("claim")
				logger.Error(err, "Cannot prepare claim", "claim", klog.KObj(claim), "uid", claim.UID)
				r.errs[claim.UID] = fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)
				continue
			}
			// Recorded as prepared before its spec exists: the spec is
			// owed from here on, and a restart writes what is missing.
			r.entries[claim.UID], r.fresh[claim.UID] = c, true
			changed = true
		}
	}
	if !changed {
		return
	}
	d.hooks.run(HookBeforeSave)
	if err := d.save(st); err != nil {
		d.metrics.prepareError("checkpoint")
		// The file is the truth: read it again on the next call.
		d.st = nil
		for _, r := range batch {
			if len(r.fresh) > 0 {
				r.err = fmt.Errorf("record seats in the checkpoint: %w", err)
			}
		}
		return
	}
	d.hooks.run(HookAfterSave)
}

// state is the checkpoint in memory, read again from the file when
// another writer replaced it (the other instance of a rolling update).
// Call with d.mu and the file lock held.
func (d *Driver) state(ctx context.Context) (*checkpoint.State, error) {
	if d.st != nil && !d.store.Changed() {
		return d.st, nil
	}
	st, res, err := d.store.Load()
	if err != nil {
		return nil, fmt.Errorf("read the checkpoint: %w", err)
	}
	if res.RecoveredFrom != nil {
		klog.FromContext(ctx).Error(res.RecoveredFrom, "Checkpoint was unusable; continuing from its previous copy")
		if err := d.save(st); err != nil {
			return nil, fmt.Errorf("rewrite the checkpoint from its previous copy: %w", err)
		}
	}
	d.st = st
	d.noteHeld(st)
	return st, nil
}

// save writes st as the checkpoint, makes it the state in memory and asks
// the flusher to make it durable. Call with d.mu and the file lock held.
func (d *Driver) save(st *checkpoint.State) error {
	if err := d.store.Save(st); err != nil {
		return err
	}
	d.st = st
	d.noteHeld(st)
	select {
	case d.flushCh <- struct{}{}:
	default:
	}
	return nil
}

// A burst of prepares saves every few milliseconds; a flush commits the
// file system's journal, which holds up the renames and spec writes of the
// calls still running. So the flusher waits until saves have been quiet
// for flushQuiet, but never longer than flushMaxDelay after the first save
// it has not flushed: one flush per burst, and a bounded window in which
// a power loss can take saves (which the next start repairs).
const (
	flushQuiet    = 20 * time.Millisecond
	flushMaxDelay = 200 * time.Millisecond
)

// flush makes every save durable soon after it happened: fsync of the
// checkpoint and its directory, coalescing saves that come meanwhile.
func (d *Driver) flush(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.flushCh:
		}
		deadline := d.clock.Now().Add(flushMaxDelay)
	gather:
		for {
			select {
			case <-ctx.Done():
				break gather
			case <-d.flushCh:
				if !d.clock.Now().Before(deadline) {
					break gather
				}
			case <-d.clock.After(flushQuiet):
				break gather
			}
		}
		if err := d.store.Sync(); err != nil {
			d.metrics.prepareError("checkpoint")
			klog.FromContext(ctx).Error(err, "Cannot flush the checkpoint to disk; it is safe against a plugin crash, not yet against a power loss")
		}
	}
}

// lockFile takes the lock that serialises the two instances of a rolling
// update around every change of the checkpoint; it is the lock the
// kubeletplugin helper of an instance that serialises its calls takes.
// Without rolling updates d.mu alone suffices.
// lockState takes the plugin's lock and then the file lock shared with the
// other pod of a rolling update; the func it returns releases both.
func (d *Driver) lockState() (func(), error) {
	d.mu.Lock()
	unlock, err := d.lockFile()
	if err != nil {
		d.mu.Unlock()
		return nil, err
	}
	return func() { unlock(); d.mu.Unlock() }, nil
}

func (d *Driver) lockFile() (func(), error) {
	if d.opts.PodUID == "" {
		return func() {}, nil
	}
	lock, err := fileutil.LockFile(filepath.Join(d.opts.PluginDataDir, "serialize.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the plugin data directory: %w", err)
	}
	return func() { lock.Close() }, nil
}

// noteHeld records the seats the checkpoint's claims hold per group
// device and, when they changed, has the slices published again: groups
// that cannot take another claim come and go (unavailableGroups: hide). Call
// with d.mu held.
func (d *Driver) noteHeld(st *checkpoint.State) {
	held := draresources.Held{}
	for _, c := range st.Claims {
		for _, dev := range c.Devices {
			held[dev.GroupDevice] += max(len(dev.Seats), 1)
		}
	}
	d.layoutMu.Lock()
	same := maps.Equal(held, d.held)
	d.held = held
	d.layoutMu.Unlock()
	if !same {
		select {
		case d.heldCh <- struct{}{}:
		default:
		}
	}
}

// heldSeats are the seats in use per group device, as of the last batch.
func (d *Driver) heldSeats() draresources.Held {
	d.layoutMu.Lock()
	defer d.layoutMu.Unlock()
	return maps.Clone(d.held)
}
