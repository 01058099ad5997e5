package seatledger

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containerclaims"
)

// batcher gathers the prepares that arrive while a batch is being recorded
// into the next one, so that concurrent claims share one checkpoint save.
type batcher struct {
	rec    *record
	assign assigner
	specs  Specs
	hooks  Hooks

	// mu guards pending, the prepares waiting for the next batch: a
	// prepare queues without rec.mu, so it can while a batch is being
	// recorded.
	mu      sync.Mutex
	pending []*Reservation
}

// reserve queues r and, unless the batch that takes it is already being
// decided by another caller, decides every reservation queued so far.
func (b *batcher) reserve(ctx context.Context, r *Reservation) {
	b.mu.Lock()
	b.pending = append(b.pending, r)
	b.mu.Unlock()

	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	if r.done {
		// An earlier holder of rec.mu took this reservation into its batch.
		return
	}
	b.mu.Lock()
	batch := b.pending
	b.pending = nil
	b.mu.Unlock()
	b.decide(ctx, batch)
}

// decide decides the seats of a batch of reservations and saves them
// once. Call with b.rec.mu held.
func (b *batcher) decide(ctx context.Context, batch []*Reservation) {
	logger := klog.FromContext(ctx)
	fail := func(err error) {
		for _, r := range batch {
			r.Err, r.done = err, true
		}
	}
	unlock, err := b.rec.lockFile()
	if err != nil {
		fail(err)
		return
	}
	defer unlock()
	st, err := b.rec.state(ctx)
	if errors.Is(err, errLost) {
		for _, r := range batch {
			r.refuseLost()
		}
		return
	}
	if err != nil {
		fail(err)
		return
	}
	changed := false
	for _, r := range batch {
		r.done = true
		r.Entries, r.Fresh, r.Rewrite, r.Errs, r.Widened = map[types.UID]*checkpoint.Claim{}, map[types.UID]bool{}, map[types.UID]bool{}, map[types.UID]error{}, nil
		for _, claim := range r.claims {
			if c, ok := st.Claims[claim.UID]; ok {
				same := sameAllocation(c, claim)
				switch {
				case same && c.Fenced():
					// Its container's seats are not known: handing it any
					// now could give it another container's.
					r.Errs[claim.UID] = fmt.Errorf("prepare claim %s/%s (%s): the seats this claim holds could not be recovered after the plugin's checkpoint was lost, so its group is fenced; delete its pods to release it, and the claim is prepared afresh", claim.Namespace, claim.Name, claim.UID)
					continue
				case same && c.Phase == checkpoint.PrepareCompleted:
					r.Entries[claim.UID] = c
					continue
				case !same:
					// The claim was deallocated and allocated anew under
					// the same UID while its old entry stayed (a lost
					// unprepare): the old seats are nobody's now. Their
					// spec goes first: should the new prepare fail, no
					// container may start from the old seats.
					if err := b.specs.Remove(claim.UID, types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}); err != nil {
						b.rec.countError("prepare", "cdi")
						r.Errs[claim.UID] = fmt.Errorf("prepare claim %s/%s (%s), allocated anew: remove the CDI spec of its earlier allocation: %w", claim.Namespace, claim.Name, claim.UID, err)
						continue
					}
					logger.Info("Replacing the seats of a claim allocated anew", "claim", klog.KObj(claim), "uid", claim.UID, "old", DescribeSeats(c))
					delete(st.Claims, claim.UID)
					changed = true
				}
			}
			c, err := b.assign.seats(st, claim)
			if err != nil {
				logger.Error(err, "Cannot prepare claim", "claim", klog.KObj(claim), "uid", claim.UID)
				r.Errs[claim.UID] = fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)
				continue
			}
			// Recorded as prepared before its spec exists: the spec is
			// owed from here on, and a restart writes what is missing.
			r.Entries[claim.UID], r.Fresh[claim.UID] = c, true
			changed = true
		}
		combined, widened := containerclaims.Combine(st, r.claims, r.Entries, r.holders)
		// Claims recorded before and sent again get their spec written
		// again whenever they are combined: a rewrite that failed, or a
		// crash after the save, is not left behind.
		for uid, c := range r.Entries {
			if !r.Fresh[uid] && c.Combined {
				r.Rewrite[uid] = true
			}
		}
		r.Widened = widened
		changed = changed || combined
	}
	for _, r := range batch {
		r.reloads = b.rec.reloads.Load()
	}
	if !changed {
		return
	}
	run(b.hooks.BeforeSave)
	if err := b.rec.save(ctx, st); err != nil {
		// The file is the truth: read it again on the next call.
		b.rec.st = nil
		for _, r := range batch {
			if len(r.Fresh) > 0 || len(r.Rewrite) > 0 || len(r.Widened) > 0 {
				r.Err = fmt.Errorf("record seats in the checkpoint: %w", err)
			}
		}
		return
	}
	run(b.hooks.AfterSave)
}
