package seatledger

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containerclaims"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// Reservation is one prepare call's claims in a batch, and what the batch
// decided for them. It holds the claims' locks until Done.
type Reservation struct {
	l      *Ledger
	claims []*resourceapi.ResourceClaim
	unlock func()
	// reloads is the ledger's count of reloads when the batch saved.
	reloads uint64
	// Entries are the claims' entries: recorded by this batch (Fresh) or
	// before.
	Entries map[types.UID]*checkpoint.Claim
	Fresh   map[types.UID]bool
	// Rewrite marks entries recorded before whose spec must be written
	// again: the claim is now combined with another in one pod.
	Rewrite map[types.UID]bool
	// Widened are held claims outside the call that a container holds
	// beside a claim of the call: their specs must be written again
	// (RewriteSpecs) before the call answers, after Done.
	Widened []types.UID
	// Errs fail single claims; Err fails the call (the checkpoint could not
	// be read or written). Lost says every claim was refused because the
	// checkpoint is lost and not rebuilt yet.
	Errs map[types.UID]error
	Err  error
	Lost bool
	done bool
	// holders are the containers that hold the call's claims.
	holders containerclaims.Holders
}

// Reserve records seats for those of claims that hold none yet, in one
// checkpoint save with every other prepare waiting at the same time. A
// claim recorded before gets its recorded entry: a repeated prepare hands
// out nothing twice. While the checkpoint is lost, every claim is refused.
//
// The reservation holds the claims' locks: the caller writes their specs,
// Confirms each, and calls Done.
func (l *Ledger) Reserve(ctx context.Context, claims []*resourceapi.ResourceClaim) *Reservation {
	return l.ReserveFor(ctx, claims, containerclaims.Holders{})
}

// ReserveFor is Reserve where holders says which containers hold the
// claims, so that claims held in one container are combined (see
// package containerclaims).
func (l *Ledger) ReserveFor(ctx context.Context, claims []*resourceapi.ResourceClaim, holders containerclaims.Holders) *Reservation {
	uids := make([]types.UID, len(claims))
	for i, c := range claims {
		uids[i] = c.UID
	}
	r := &Reservation{l: l, claims: claims, holders: holders}
	r.unlock = sync.OnceFunc(l.claims.lock(uids))
	if l.rec.lost.Load() {
		r.refuseLost()
		return r
	}
	l.batches.reserve(ctx, r)
	return r
}

// StandaloneClaims lists the standalone claims the node holds.
func (l *Ledger) StandaloneClaims(ctx context.Context) ([]types.NamespacedName, error) {
	unlock, err := l.rec.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, err := l.rec.state(ctx)
	if err != nil {
		return nil, err
	}
	var out []types.NamespacedName
	for _, c := range st.Claims {
		if c.Standalone {
			out = append(out, types.NamespacedName{Namespace: c.Namespace, Name: c.Name})
		}
	}
	return out, nil
}

// refuseLost refuses every claim of the reservation: the checkpoint is
// lost.
func (r *Reservation) refuseLost() {
	r.Lost, r.done, r.Errs = true, true, map[types.UID]error{}
	for _, claim := range r.claims {
		r.Errs[claim.UID] = fmt.Errorf("prepare claim %s/%s (%s): the plugin's checkpoint was lost and is not rebuilt yet (it is rebuilt from the API server as soon as that answers); seats cannot be chosen safely until it is, retrying", claim.Namespace, claim.Name, claim.UID)
	}
}

// Release releases claims: their specs go and their seats become free
// (their generations stay, so the next holder sees a new one). An unknown
// claim is already released. A claim whose spec cannot be removed keeps
// its seats and gets an error of its own; err fails the whole call (the
// checkpoint could not be read or written). While the checkpoint is lost,
// releasing is still safe: the spec goes, and the rebuild will not bring
// the claim back.
func (l *Ledger) Release(ctx context.Context, uids []types.UID) (map[types.UID]error, error) {
	defer l.claims.lock(uids)()
	l.rec.mu.Lock()
	defer l.rec.mu.Unlock()
	if !l.rec.lost.Load() {
		results, err := l.releaseRecorded(ctx, uids)
		if !errors.Is(err, errLost) {
			return results, err
		}
	}
	results := map[types.UID]error{}
	for _, uid := range uids {
		results[uid] = l.opts.Specs.Remove(uid, types.NamespacedName{})
		// The API server may show the claim allocated for a while yet.
		l.rec.releasedWhileLost[uid] = true
	}
	return results, nil
}

// releaseRecorded releases claims from the record; errLost if it turns out
// to be lost. Call with l.rec.mu held.
func (l *Ledger) releaseRecorded(ctx context.Context, uids []types.UID) (map[types.UID]error, error) {
	logger := klog.FromContext(ctx)
	unlock, err := l.rec.lockFile()
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, err := l.rec.state(ctx)
	if err != nil {
		return nil, err
	}
	results := map[types.UID]error{}
	changed := false
	for _, uid := range uids {
		results[uid] = nil
		var name types.NamespacedName
		if c, ok := st.Claims[uid]; ok {
			name = types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
		}
		if err := l.opts.Specs.Remove(uid, name); err != nil {
			results[uid] = err
			continue
		}
		run(l.opts.Hooks.AfterSpecRemove)
		if c, ok := st.Claims[uid]; ok {
			delete(st.Claims, uid)
			changed = true
			logger.V(2).Info("Unprepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "seats", DescribeSeats(c))
		}
	}
	if changed {
		if err := l.rec.save(ctx, st); err != nil {
			l.rec.st = nil
			return nil, fmt.Errorf("release seats in the checkpoint: %w", err)
		}
		run(l.opts.Hooks.AfterReleaseSave)
	}
	return results, nil
}

// Done releases the claims' locks. Call it once the specs are written;
// calls after the first do nothing.
func (r *Reservation) Done() { r.unlock() }

// Confirm checks, after the claim's spec was written, that the claim still
// holds what was reserved for it. Within one plugin the claims' locks see
// to that; the other pod of a rolling update takes no such lock, and may
// have released the claim meanwhile. That is rare and cheap to rule out:
// unless the checkpoint was replaced by the other pod since, Confirm does
// no more than stat it. If the claim was released, the spec just written
// is removed again and Confirm says so.
func (r *Reservation) Confirm(ctx context.Context, uid types.UID) error {
	l := r.l
	if !l.opts.SharedWithPeer || (l.rec.reloads.Load() == r.reloads && !l.rec.store.Changed()) {
		return nil
	}
	unlock, err := l.rec.lock()
	if err != nil {
		return err
	}
	defer unlock()
	st, err := l.rec.state(ctx)
	if err != nil {
		return err
	}
	c := st.Claims[uid]
	if c != nil && reflect.DeepEqual(c.Devices, r.Entries[uid].Devices) {
		return nil
	}
	if c != nil {
		// The other pod released the claim and prepared it anew: the spec
		// is its entry's, which the one just written replaced.
		if !c.Fenced() {
			if err := l.opts.Specs.Write(uid, c); err != nil {
				klog.FromContext(ctx).Error(err, "Cannot restore the spec of a claim the other plugin pod prepared anew", "uid", uid)
			}
		}
		return fmt.Errorf("the other plugin pod of a rolling update prepared the claim anew while this one prepared it; the kubelet prepares it again if it still needs it")
	}
	mine := r.Entries[uid]
	if err := l.opts.Specs.Remove(uid, types.NamespacedName{Namespace: mine.Namespace, Name: mine.Name}); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot remove the spec of a claim released while it was prepared", "uid", uid)
	}
	return fmt.Errorf("the other plugin pod of a rolling update released the claim while this one prepared it; the kubelet prepares it again if it still needs it")
}

// DescribeSeats says which seats of which groups a claim holds, for logs.
func DescribeSeats(c *checkpoint.Claim) []string {
	var out []string
	for _, dev := range c.Devices {
		out = append(out, fmt.Sprintf("%s seats %v gen %v", dev.Group+"/"+dev.Profile, dev.Seats, dev.Generations))
	}
	return out
}

// sameAllocation reports whether c records exactly the claim's current
// allocation on this driver: the same devices, shares and requests.
func sameAllocation(c *checkpoint.Claim, claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	type result struct{ request, pool, device, share string }
	var want, got []result
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driver.Name {
			continue
		}
		share := ""
		if r.ShareID != nil {
			share = string(*r.ShareID)
		}
		want = append(want, result{resourceclaim.BaseRequestRef(r.Request), r.Pool, r.Device, share})
	}
	for _, d := range c.Devices {
		for _, req := range d.Requests {
			got = append(got, result{req, d.Pool, d.Device, d.ShareID})
		}
	}
	cmp := func(a, b result) int {
		return strings.Compare(a.request+"/"+a.pool+"/"+a.device+"/"+a.share, b.request+"/"+b.pool+"/"+b.device+"/"+b.share)
	}
	slices.SortFunc(want, cmp)
	slices.SortFunc(got, cmp)
	return slices.Equal(want, got)
}
