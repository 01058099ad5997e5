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

// Reservation is one prepare call's claims in a batch, and the ledger's
// answer for each. It holds the claims' locks until Done.
type Reservation struct {
	l      *Ledger
	claims []*resourceapi.ResourceClaim
	unlock func()
	// holders are the containers that hold the call's claims.
	holders containerclaims.Holders
	// reloads is the ledger's count of reloads when the batch saved.
	reloads uint64
	done    bool
	// Claims are the ledger's answers, one per claim of the call, in the
	// call's order.
	Claims []Outcome
	// Err fails the call: the checkpoint could not be read or written.
	// The answers are then not to be acted on.
	Err error
	// widened are held claims outside the call that a container holds
	// beside a claim of the call: Finish writes their specs again.
	widened []types.UID
}

// Outcome is the ledger's answer for one claim of a prepare call.
type Outcome struct {
	Claim *resourceapi.ResourceClaim
	// Entry is the claim's seats as recorded; nil where Err is set. An
	// entry's devices never change once recorded.
	Entry *checkpoint.Claim
	// State says what the call did with the claim, and so what is left to
	// do before its prepare is answered.
	State State
	// Err refuses the claim: it names the claim and why. It is
	// ErrCheckpointLost (errors.Is) while the checkpoint is lost.
	Err error
}

// State is what a prepare call did with a claim.
type State int

const (
	// Refused: the claim holds nothing (Outcome.Err says why).
	Refused State = iota
	// Fresh: this call recorded the claim's seats. Its spec is owed from
	// here on: nothing else was made for it yet.
	Fresh
	// Recorded: an earlier call recorded the claim's seats; its spec is
	// on the node unless the node lost it.
	Recorded
	// SpecOwed: an earlier call recorded the claim's seats, and its spec
	// must be written again: a container holds it beside another claim
	// now (package containerclaims), so the spec names GPUs anew.
	SpecOwed
)

// ErrCheckpointLost refuses every claim while the checkpoint is lost and
// not rebuilt yet.
var ErrCheckpointLost = errors.New("the plugin's checkpoint was lost and is not rebuilt yet (it is rebuilt from the API server as soon as that answers); seats cannot be chosen safely until it is, retrying")

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

// StandaloneClaims lists the standalone claims the node holds, and
// whether the spec of each names every GPU of the node already (read from
// disk, outside the ledger's lock, for those recorded so: the spec is what
// containers get, and a rewrite that failed may have left it narrower).
func (l *Ledger) StandaloneClaims(ctx context.Context) ([]containerclaims.HeldClaim, error) {
	unlock, err := l.rec.lock()
	if err != nil {
		return nil, err
	}
	st, err := l.rec.state(ctx)
	if err != nil {
		unlock()
		return nil, err
	}
	gpus := len(l.opts.Inventory.GPUs)
	var out []containerclaims.HeldClaim
	recorded := map[int]types.UID{} // of out, those recorded as naming every GPU
	for uid, c := range st.Claims {
		if !c.Standalone {
			continue
		}
		if c.Combined && c.IndexedGPUs(gpus) == gpus {
			recorded[len(out)] = uid
		}
		out = append(out, containerclaims.HeldClaim{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
	}
	unlock()
	for i, uid := range recorded {
		env, ok, err := l.opts.Specs.ReadEnv(uid)
		out[i].EveryGPU = ok && err == nil && containerclaims.NamesEveryGPU(env, gpus)
	}
	return out, nil
}

// refuseLost refuses every claim of the reservation: the checkpoint is
// lost.
func (r *Reservation) refuseLost() {
	r.done = true
	r.Claims = make([]Outcome, len(r.claims))
	for i, claim := range r.claims {
		r.Claims[i] = Outcome{Claim: claim, Err: fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, ErrCheckpointLost)}
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

// Finish releases the claims' locks and writes again the specs of the
// held claims outside the call that a container holds beside one of its
// claims (RewriteSpecs): another prepare may hold those claims' locks and
// want these. An error fails the call's claims: the kubelet prepares them
// again, which tries again.
func (r *Reservation) Finish(ctx context.Context) error {
	r.Done()
	if len(r.widened) == 0 {
		return nil
	}
	return r.l.RewriteSpecs(ctx, r.widened)
}

// entry is the entry the reservation recorded or found for uid.
func (r *Reservation) entry(uid types.UID) *checkpoint.Claim {
	for _, o := range r.Claims {
		if o.Claim.UID == uid {
			return o.Entry
		}
	}
	return nil
}

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
	mine := r.entry(uid)
	if c != nil && reflect.DeepEqual(c.Devices, mine.Devices) {
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
