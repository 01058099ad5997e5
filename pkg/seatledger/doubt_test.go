package seatledger

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint/checkpointtest"
)

// A checkpoint that loads may still be behind what the node gave
// containers: a previous copy lacks the last save, and a checkpoint
// deleted with its copy looks like a first start. The specs on the node
// tell.

// prepared reserves seats for claims as the plugin's prepare does: the
// entry, then its spec, then (the status writer) its status.
func (r *rig) prepared(l *Ledger, claims ...*resourceapi.ResourceClaim) map[types.UID]*checkpoint.Claim {
	r.t.Helper()
	res := reserve(r.ctx, l, claims)
	for _, c := range claims {
		if err := res.Errs[c.UID]; err != nil {
			r.t.Fatal(err)
		}
		if err := r.specs.Write(c.UID, res.Entries[c.UID]); err != nil {
			r.t.Fatal(err)
		}
		r.store(c, statusOf(res.Entries[c.UID].Devices[0]))
	}
	return res.Entries
}

// apiDown makes the fake API server refuse to list claims until the
// returned func is called.
func (r *rig) apiDown() (up func()) {
	var down atomic.Bool
	down.Store(true)
	r.client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	return func() { down.Store(false) }
}

// newSeat is what a new claim on g0-1x gets.
func newSeat(t *testing.T, r *rig, l *Ledger) []int {
	t.Helper()
	return newSeatOn(t, r, l, "g0-1x")
}

// newSeatOn is what a new claim on device gets.
func newSeatOn(t *testing.T, r *rig, l *Ledger, device string) []int {
	t.Helper()
	n := claim("new", device)
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{n})
	if err := res.Errs[n.UID]; err != nil {
		t.Fatalf("a new claim: %v", err)
	}
	return res.Entries[n.UID].Devices[0].Seats
}

// Both copies deleted while a claim holds a seat: not a first start. The
// spec on the node says a container holds the seat; the record is rebuilt
// and the seat is not handed out again.
func TestDeletedCheckpointWithSpecsOnTheNodeIsRebuilt(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a := claim("a", "g0-1x")
	held := r.prepared(l, a)
	l.Close(r.ctx)
	checkpointtest.Delete(t, r.dir)
	l = r.open()
	if !r.specs.Exists(a.UID) {
		t.Errorf("the spec of the held claim was removed at start")
	}
	if got, want := newSeat(t, r, l), held[a.UID].Devices[0].Seats; slices.Equal(got, want) {
		t.Errorf("a new claim got seat %v, the held claim's: handed out twice", got)
	}
	if !strings.Contains(strings.Join(logged(t, r), "\n"), "no checkpoint exists: claim uid-a has a CDI spec on the node but no entry") {
		t.Error("no log says why the checkpoint was rebuilt")
	}

	// The same with the API server down: the ledger is lost, not empty.
	l.Close(r.ctx)
	checkpointtest.Delete(t, r.dir)
	r.apiDown()
	if l = r.open(); !l.Lost() {
		t.Error("the ledger trusts an empty checkpoint while a held claim's spec is on the node")
	}
}

// A first start (no checkpoint, no spec of the driver's) asks the API
// server nothing.
func TestFirstStartDoesNotRebuild(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	if l.Lost() {
		t.Error("lost at a first start")
	}
	for _, a := range r.client.Actions() {
		if a.GetVerb() == "list" && a.GetResource().Resource == "resourceclaims" {
			t.Errorf("a first start listed the claims: %v", a)
		}
	}
	if got := newSeat(t, r, l); !slices.Equal(got, []int{0}) {
		t.Errorf("the first claim got seat %v, want 0", got)
	}
}

// The checkpoint damaged, its previous copy one save behind: that save
// prepared b, whose spec is on the node. The previous copy does not stand
// for the checkpoint; it is rebuilt, and b keeps its seat.
func TestPreviousCopyBehindTheSpecsIsNotTrusted(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a, b := claim("a", "g0-1x"), claim("b", "g0-1x")
	r.prepared(l, a)
	held := r.prepared(l, b)
	l.Close(r.ctx)
	checkpointtest.FlipBit(t, r.dir)
	l = r.open()
	if !r.specs.Exists(b.UID) {
		t.Errorf("the spec of b was removed at start")
	}
	if got := newSeat(t, r, l); slices.Equal(got, held[b.UID].Devices[0].Seats) {
		t.Errorf("a new claim got b's seat %v: handed out twice", got)
	}
	if !strings.Contains(strings.Join(logged(t, r), "\n"), "its previous copy is behind the node: claim uid-b has a CDI spec on the node but no entry") {
		t.Error("no log says why the previous copy was not trusted")
	}
}

// The checkpoint damaged, its previous copy one save behind: that save
// released b, whose spec went first. The previous copy records every spec
// on the node, so it stands, with the API server down: b only holds its
// seat until it is found stale.
func TestPreviousCopyThatRecordsEverySpecStands(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a, b := claim("a", "g0-1x"), claim("b", "g0-1x")
	r.prepared(l, a, b)
	if _, err := l.Release(r.ctx, []types.UID{b.UID}); err != nil {
		t.Fatal(err)
	}
	l.Close(r.ctx)
	checkpointtest.FlipBit(t, r.dir)
	r.apiDown()
	l = r.open()
	if l.Lost() {
		t.Fatal("lost, although the previous copy records every spec on the node")
	}
	if got := newSeat(t, r, l); !slices.Equal(got, []int{2}) {
		t.Errorf("a new claim got seat %v, want 2 (a and b hold 0 and 1)", got)
	}
	if kept, _ := filepath.Glob(filepath.Join(r.dir, checkpoint.FileName+".corrupt-*")); len(kept) != 1 {
		t.Errorf("the damaged file must be kept aside for diagnosis: %v", kept)
	}
}

// The other pod of a rolling update may leave the checkpoint damaged
// while this one runs (it crashed mid-save, or a disk fault): the next
// call finds the previous copy behind the specs, refuses new claims, and
// the record is rebuilt in the background; the statuses of the rebuilt
// claims are owed again.
func TestCheckpointDamagedWhileRunningIsRebuilt(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	var recovered atomic.Int32
	r.opts.Recovered = func() { recovered.Add(1) }
	l := r.open()
	a, b := claim("a", "g0-1x"), claim("b", "g0-1x")
	r.prepared(l, a)
	held := r.prepared(l, b)
	checkpointtest.FlipBit(t, r.dir)
	up := r.apiDown()
	n := claim("new", "g0-1x")
	if res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{n}); !res.Lost || res.Errs[n.UID] == nil {
		t.Fatalf("a new claim on a damaged checkpoint: lost %v, %v", res.Lost, res.Errs[n.UID])
	}
	if _, err := l.Release(r.ctx, []types.UID{a.UID}); err != nil {
		t.Errorf("a release while lost: %v", err)
	}
	up()
	waitFor(t, func() bool { return !l.Lost() })
	waitFor(t, func() bool { return recovered.Load() == 1 })
	if owed := l.StatusesOwed(); !slices.Equal(owed, []types.UID{b.UID}) {
		t.Errorf("statuses owed after the rebuild: %v, want b's (a was released while lost)", owed)
	}
	if got := newSeat(t, r, l); slices.Equal(got, held[b.UID].Devices[0].Seats) {
		t.Errorf("a new claim got b's seat %v: handed out twice", got)
	}
}

// While this pod has lost the checkpoint and the API server does not
// answer, the other pod of a rolling update may write a good one: this
// pod takes it, without the API server.
func TestLostLedgerAdoptsTheCheckpointTheOtherPodWrote(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	r.opts.SharedWithPeer = true
	l := r.open()
	a, b := claim("a", "g0-1x"), claim("b", "g0-1x")
	r.prepared(l, a)
	r.prepared(l, b)
	good, _, err := checkpoint.NewStore(r.dir).Load()
	if err != nil {
		t.Fatal(err)
	}
	checkpointtest.FlipBit(t, r.dir)
	r.apiDown()
	n := claim("new", "g0-1x")
	if res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{n}); !res.Lost {
		t.Fatalf("a new claim on a damaged checkpoint was not refused: %v", res.Errs[n.UID])
	}
	if err := checkpoint.NewStore(r.dir).Save(good); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !l.Lost() })
	if got := newSeat(t, r, l); !slices.Equal(got, []int{2}) {
		t.Errorf("a new claim got seat %v, want 2 (a and b hold 0 and 1)", got)
	}
}
