package seatledger

import (
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// A claim deallocated and allocated anew under the same UID, while its
// old entry stayed (an unprepare lost), is prepared for its new devices,
// not answered from the old entry; the old seats are free again.
func TestClaimAllocatedAnewGetsItsNewDevices(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	old := claim("c", "g0-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{old})
	anew := claim("c", "g1-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{anew})
	if res.Errs[anew.UID] != nil || !res.Fresh[anew.UID] {
		t.Fatalf("the claim allocated anew: %v, fresh %v", res.Errs[anew.UID], res.Fresh[anew.UID])
	}
	if dev := res.Entries[anew.UID].Devices; len(dev) != 1 || dev[0].Device != "g1-1x" {
		t.Errorf("the claim allocated anew holds %+v, want g1-1x", dev)
	}
	if got := r.lastHeld(); len(got) != 1 || got["g1-1x"] != 1 {
		t.Errorf("held %v, want only g1-1x", got)
	}
	// The same allocation again is a repeated prepare.
	if again := reserve(r.ctx, l, []*resourceapi.ResourceClaim{anew}); again.Fresh[anew.UID] || again.Entries[anew.UID] != res.Entries[anew.UID] {
		t.Errorf("a repeated prepare of the new allocation was not answered from its entry")
	}
}

// A release of a claim that arrives while the claim is being prepared
// waits until its spec is written, then removes both: never a live spec
// without an entry.
func TestReleaseDuringAPrepareWaitsForIt(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	c := claim("c", "g0-1x")
	res := byClaim(l.Reserve(r.ctx, []*resourceapi.ResourceClaim{c}))
	released := make(chan error, 1)
	go func() {
		_, err := l.Release(r.ctx, []types.UID{c.UID})
		released <- err
	}()
	select {
	case err := <-released:
		t.Fatalf("the release finished while the prepare still had a spec to write: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := r.specs.Write(c.UID, res.Entries[c.UID]); err != nil {
		t.Fatal(err)
	}
	if err := res.Confirm(r.ctx, c.UID); err != nil {
		t.Fatal(err)
	}
	res.Done()
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if r.specs.Exists(c.UID) {
		t.Error("a spec stayed after the release")
	}
	if got := r.lastHeld(); len(got) != 0 {
		t.Errorf("held %v after the release", got)
	}
}

// openWithPeer opens the rig's ledger and that of the other pod of a
// rolling update, on the same directory; the peer is closed at the end of
// the test.
func (r *rig) openWithPeer(t *testing.T) (*Ledger, *Ledger) {
	t.Helper()
	r.opts.SharedWithPeer = true
	l := r.open()
	peerOpts := r.opts
	peerOpts.UsageChanged = nil
	peer, err := Open(r.ctx, peerOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close(r.ctx) })
	return l, peer
}

// The other pod of a rolling update may release a claim between this
// pod's choice of seats and its spec write: Confirm finds out and takes
// the spec back.
func TestReleaseByTheOtherPodDuringAPrepareIsFound(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l, peer := r.openWithPeer(t)
	c := claim("c", "g0-1x")
	res := byClaim(l.Reserve(r.ctx, []*resourceapi.ResourceClaim{c}))
	if res.Errs[c.UID] != nil {
		t.Fatal(res.Errs[c.UID])
	}
	if got, err := peer.Release(r.ctx, []types.UID{c.UID}); err != nil || got[c.UID] != nil {
		t.Fatalf("the peer's release: %v %v", got, err)
	}
	if err := r.specs.Write(c.UID, res.Entries[c.UID]); err != nil {
		t.Fatal(err)
	}
	err := res.Confirm(r.ctx, c.UID)
	res.Done()
	if err == nil || !strings.Contains(err.Error(), "released the claim while this one prepared it") {
		t.Errorf("Confirm: %v", err)
	}
	if r.specs.Exists(c.UID) {
		t.Error("the spec of a released claim stayed")
	}
	// Without a release in between, Confirm passes.
	d := claim("d", "g1-1x")
	res = byClaim(l.Reserve(r.ctx, []*resourceapi.ResourceClaim{d}))
	defer res.Done()
	if err := r.specs.Write(d.UID, res.Entries[d.UID]); err != nil {
		t.Fatal(err)
	}
	if err := res.Confirm(r.ctx, d.UID); err != nil || !r.specs.Exists(d.UID) {
		t.Errorf("Confirm of an undisturbed claim: %v", err)
	}
}

// A claim allocated anew whose new prepare fails (its new device is not
// the node's) must not leave the spec of its old seats behind: a
// container started from it would use seats that are free again.
func TestClaimAllocatedAnewLosesItsOldSpecEvenIfItsPrepareFails(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	old := claim("c", "g0-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{old})
	if err := r.specs.Write(old.UID, res.Entries[old.UID]); err != nil {
		t.Fatal(err)
	}
	anew := claim("c", "no-such-device")
	if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{anew}).Errs[anew.UID]; err == nil {
		t.Fatal("a claim allocated anew on a device the node does not publish was prepared")
	}
	if r.specs.Exists(old.UID) {
		t.Error("the spec of the old seats stayed after they were freed")
	}
	if got := r.lastHeld(); len(got) != 0 {
		t.Errorf("held %v, want nothing", got)
	}

	// A spec that cannot go keeps the old entry: the seats stay held.
	res = reserve(r.ctx, l, []*resourceapi.ResourceClaim{old})
	if err := r.specs.Write(old.UID, res.Entries[old.UID]); err != nil {
		t.Fatal(err)
	}
	r.specs.stuck = map[types.UID]bool{old.UID: true}
	again := claim("c", "g1-1x")
	if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{again}).Errs[again.UID]; err == nil || !strings.Contains(err.Error(), "remove the CDI spec of its earlier allocation") {
		t.Errorf("allocated anew while the old spec cannot go: %v", err)
	}
	if got := r.lastHeld(); len(got) != 1 || got["g0-1x"] != 1 {
		t.Errorf("held %v, want the old seat of g0-1x still", got)
	}
}

// An entry an older plugin left as started (its prepare cut short) is
// resumed only for the same allocation: a claim allocated anew since gets
// its new devices.
func TestStartedEntryOfAnEarlierAllocationIsReplaced(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	old := claim("c", "g0-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{old})
	l.Close(r.ctx)
	store := checkpoint.NewStore(r.dir)
	st, _, err := store.Load()
	if err != nil {
		t.Fatal(err)
	}
	st.Claims[old.UID].Phase = checkpoint.PrepareStarted
	if err := store.Save(st); err != nil {
		t.Fatal(err)
	}
	l = r.open()
	anew := claim("c", "g1-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{anew})
	if err := res.Errs[anew.UID]; err != nil {
		t.Fatal(err)
	}
	if dev := res.Entries[anew.UID].Devices; len(dev) != 1 || dev[0].Device != "g1-1x" {
		t.Errorf("the claim allocated anew holds %+v, want g1-1x", dev)
	}
	if got := r.lastHeld(); len(got) != 1 || got["g1-1x"] != 1 {
		t.Errorf("held %v, want only g1-1x", got)
	}
}

// The other pod of a rolling update may release a claim and prepare it
// anew between this pod's choice of seats and its spec write: the spec is
// then the other pod's entry's, and Confirm puts it back.
func TestPrepareAnewByTheOtherPodKeepsItsSpec(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l, peer := r.openWithPeer(t)
	c := claim("c", "g0-1x")
	res := byClaim(l.Reserve(r.ctx, []*resourceapi.ResourceClaim{c}))
	defer res.Done()
	if _, err := peer.Release(r.ctx, []types.UID{c.UID}); err != nil {
		t.Fatal(err)
	}
	anew := claim("c", "g1-1x")
	theirs := reserve(r.ctx, peer, []*resourceapi.ResourceClaim{anew}).Entries[anew.UID]
	if err := r.specs.Write(c.UID, theirs); err != nil {
		t.Fatal(err)
	}
	// This pod's spec write replaces the other pod's.
	if err := r.specs.Write(c.UID, res.Entries[c.UID]); err != nil {
		t.Fatal(err)
	}
	if err := res.Confirm(r.ctx, c.UID); err == nil || !strings.Contains(err.Error(), "prepared the claim anew") {
		t.Errorf("Confirm: %v", err)
	}
	r.specs.mu.Lock()
	got := r.specs.specs[c.UID]
	r.specs.mu.Unlock()
	if got == nil || len(got.Devices) != 1 || got.Devices[0].Device != "g1-1x" {
		t.Errorf("the claim's spec is %+v, want the other pod's (g1-1x)", got)
	}
}

// podClaim is a claim made for one pod from its template.
func podClaim(name string, devices ...string) *resourceapi.ResourceClaim {
	c := claim(name, devices...)
	yes := true
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod-" + name, UID: types.UID("pod-" + name), Controller: &yes}}
	return c
}

// Where the kubelet does not say which containers hold them, the claims
// of one call are combined even when one of them fails there: whether
// they may share a container does not depend on it. A pod's own claim
// alone is not combined; sent again once combined, an entry's spec is
// written again.
func TestCombine(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	defer l.Close(r.ctx)
	alone := reserve(r.ctx, l, []*resourceapi.ResourceClaim{podClaim("alone", "g1-1x")})
	if c := alone.Entries["uid-alone"]; c == nil || c.Combined || c.Standalone {
		t.Errorf("a pod's own claim alone: %+v", c)
	}
	pair := reserve(r.ctx, l, []*resourceapi.ResourceClaim{podClaim("a", "g0-1x"), podClaim("b", "no-such-device")})
	if pair.Errs["uid-b"] == nil {
		t.Fatal("a claim on no device was prepared")
	}
	if c := pair.Entries["uid-a"]; c == nil || !c.Combined {
		t.Errorf("the partner of a failed claim: %+v", c)
	}
	again := reserve(r.ctx, l, []*resourceapi.ResourceClaim{podClaim("a", "g0-1x")})
	if !again.Rewrite["uid-a"] || again.Fresh["uid-a"] {
		t.Errorf("a combined claim sent again: rewrite %v, fresh %v", again.Rewrite["uid-a"], again.Fresh["uid-a"])
	}
	shared := podClaim("shared", "g2-1x")
	shared.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p1", UID: "p1"}, {Resource: "pods", Name: "p2", UID: "p2"}}
	if c := reserve(r.ctx, l, []*resourceapi.ResourceClaim{shared}).Entries["uid-shared"]; c == nil || !c.Standalone || !c.Combined {
		t.Errorf("a pod's claim that two pods reserve: %+v", c)
	}
}

// Two schedulers that each count only their own in-flight allocations can
// allocate one seat twice (kubernetes#128980). The node refuses the second
// claim, naming what holds the seat, and prepares it once the first is
// released: the kubelet's retry then succeeds.
func TestReserveRefusesASeatAllocatedTwice(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	var held []*resourceapi.ResourceClaim
	for _, name := range []string{"a", "b", "c", "first"} {
		held = append(held, claim(name, "g0-1x"))
	}
	// The fallback slices' per-seat devices: one device, allocated twice.
	perSeat := claim("per-seat", "g4-1x-seat-0")
	held = append(held, perSeat)
	if res := reserve(r.ctx, l, held); res.Err != nil || len(res.Errs) != 0 {
		t.Fatalf("Reserve: %v %v", res.Err, res.Errs)
	}
	second, perSeatTwice := claim("second", "g0-1x"), claim("per-seat-twice", "g4-1x-seat-0")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{second, perSeatTwice})
	for uid, want := range map[types.UID]string{
		second.UID:       "prepare claim default/second (uid-second): group G0: device g0-1x has 0 free seat(s) of 4, 1 needed; the scheduler counts seats, so another claim holds more than it should",
		perSeatTwice.UID: "prepare claim default/per-seat-twice (uid-per-seat-twice): seat 0 of group G4 is already held by claim default/per-seat (uid-per-seat)",
	} {
		if err := res.Errs[uid]; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", uid, err, want)
		}
		if res.Entries[uid] != nil {
			t.Errorf("%s was recorded although refused", uid)
		}
	}
	if got := r.lastHeld(); got["g0-1x"] != 4 {
		t.Errorf("held %v, want g0-1x: 4", got)
	}

	for _, c := range []*resourceapi.ResourceClaim{held[3], perSeat} {
		if err := r.specs.Write(c.UID, &checkpoint.Claim{}); err != nil {
			t.Fatal(err)
		}
	}
	if released, err := l.Release(r.ctx, []types.UID{held[3].UID, perSeat.UID}); err != nil || released[held[3].UID] != nil || released[perSeat.UID] != nil {
		t.Fatalf("Release: %v %v", released, err)
	}
	res = reserve(r.ctx, l, []*resourceapi.ResourceClaim{second, perSeatTwice})
	if res.Err != nil || len(res.Errs) != 0 {
		t.Fatalf("the retried prepares after the first holders' release: %v %v", res.Err, res.Errs)
	}
	if got := seatsOf(res.Entries[second.UID]); len(got) != 1 || !slices.Equal(got[0], []int{3}) {
		t.Errorf("second holds seats %v, want [[3]]", got)
	}
}
