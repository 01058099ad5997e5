package seatledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
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
		if b.decideCall(ctx, st, r) {
			changed = true
		}
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
			if r.changed() {
				r.Err = fmt.Errorf("record seats in the checkpoint: %w", err)
			}
		}
		return
	}
	run(b.hooks.AfterSave)
}

// decideCall decides one call's claims in st and marks those a container
// holds together; it reports whether st changed. Call with b.rec.mu held.
func (b *batcher) decideCall(ctx context.Context, st *checkpoint.State, r *Reservation) bool {
	r.done = true
	r.Claims = make([]Outcome, len(r.claims))
	entries := map[types.UID]*checkpoint.Claim{}
	changed := false
	for i, claim := range r.claims {
		o, stChanged := b.decideClaim(ctx, st, claim)
		r.Claims[i] = o
		if o.Entry != nil {
			entries[claim.UID] = o.Entry
		}
		changed = changed || stChanged
	}
	combined, widened := containerclaims.Combine(st, r.claims, entries, r.holders)
	// Claims recorded before and sent again get their spec written again
	// whenever they are combined: a rewrite that failed, or a crash after
	// the save, is not left behind.
	for i, o := range r.Claims {
		if o.State == Recorded && o.Entry.Combined {
			r.Claims[i].State = SpecOwed
		}
	}
	r.widened = widened
	return changed || combined
}

// decideClaim answers one claim: its entry recorded before, or seats
// recorded now, or why it gets none; stChanged says whether st changed.
// Call with b.rec.mu held.
func (b *batcher) decideClaim(ctx context.Context, st *checkpoint.State, claim *resourceapi.ResourceClaim) (o Outcome, stChanged bool) {
	logger := klog.FromContext(ctx)
	o.Claim = claim
	if c, ok := st.Claims[claim.UID]; ok {
		same := sameAllocation(c, claim)
		switch {
		case same && c.Fenced():
			// Its container's seats are not known: handing it any now
			// could give it another container's.
			o.Err = fmt.Errorf("prepare claim %s/%s (%s): the seats this claim holds could not be recovered after the plugin's checkpoint was lost, so its group is fenced; delete its pods to release it, and the claim is prepared afresh", claim.Namespace, claim.Name, claim.UID)
			return o, false
		case same && c.Phase == checkpoint.PrepareCompleted:
			o.Entry, o.State = c, Recorded
			return o, false
		case !same:
			// The claim was deallocated and allocated anew under the same
			// UID while its old entry stayed (a lost unprepare): the old
			// seats are nobody's now. Their spec goes first: should the
			// new prepare fail, no container may start from the old seats.
			if err := b.specs.Remove(claim.UID, types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}); err != nil {
				b.rec.countError("prepare", "cdi")
				o.Err = fmt.Errorf("prepare claim %s/%s (%s), allocated anew: remove the CDI spec of its earlier allocation: %w", claim.Namespace, claim.Name, claim.UID, err)
				return o, false
			}
			logger.Info("Replacing the seats of a claim allocated anew", "claim", klog.KObj(claim), "uid", claim.UID, "old", DescribeSeats(c))
			delete(st.Claims, claim.UID)
			stChanged = true
		}
	}
	c, err := b.assign.seats(st, claim)
	if err != nil {
		o.Err = fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)
		return o, stChanged
	}
	// Recorded as prepared before its spec exists: the spec is owed from
	// here on, and a restart writes what is missing.
	o.Entry, o.State = c, Fresh
	return o, true
}

// changed reports whether the reservation changed the record: seats
// recorded, entries combined, or held claims widened.
func (r *Reservation) changed() bool {
	return len(r.widened) > 0 || slices.ContainsFunc(r.Claims, func(o Outcome) bool { return o.State == Fresh || o.State == SpecOwed })
}
