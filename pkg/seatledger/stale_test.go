package seatledger

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
)

func TestReleaseStaleDropsClaimsTheAPIServerNoLongerAllocatesHere(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	kept, gone, replaced, elsewhere := claim("kept", "g0-1x"), claim("gone", "g1-1x"), claim("replaced", "g2-1x"), claim("elsewhere", "g3-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{kept, gone, replaced, elsewhere})
	for _, c := range []*resourceapi.ResourceClaim{kept, replaced, elsewhere} {
		c := c.DeepCopy()
		switch c.Name {
		case "replaced":
			c.UID = "uid-replaced-2"
		case "elsewhere":
			c.Status.Allocation.Devices.Results[0].Pool = "node-2"
		}
		if _, err := r.client.ResourceV1().ResourceClaims("default").Create(r.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	l.ReleaseStale(ctx)
	if got := r.lastHeld(); len(got) != 1 || got["g0-1x"] != 1 {
		t.Errorf("held after releasing stale claims: %v, want only kept's g0-1x", got)
	}
}

// A stale claim whose spec cannot be removed keeps its seats (a container
// may still start from the spec); the others are released all the same.
func TestReleaseStaleKeepsTheSeatsOfAClaimWhoseSpecCannotGo(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	stuck, gone := claim("stuck", "g0-1x"), claim("gone", "g1-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{stuck, gone})
	for _, c := range []*resourceapi.ResourceClaim{stuck, gone} {
		if err := r.specs.Write(c.UID, res.Entries[c.UID]); err != nil {
			t.Fatal(err)
		}
	}
	r.specs.stuck = map[types.UID]bool{stuck.UID: true}
	stale, err := l.stale.find(r.ctx)
	if err != nil || len(stale) != 2 {
		t.Fatalf("stale %v, %v: want both claims (neither exists)", stale, err)
	}
	err = l.stale.release(r.ctx, stale)
	if err == nil || !strings.Contains(err.Error(), "claim default/stuck (uid-stuck) keeps its seats: read-only file system") {
		t.Errorf("release: %v", err)
	}
	if got := r.lastHeld(); len(got) != 1 || got["g0-1x"] != 1 {
		t.Errorf("held %v, want only stuck's g0-1x", got)
	}
	if r.specs.Exists(gone.UID) || !r.specs.Exists(stuck.UID) {
		t.Error("gone's spec must go, stuck's stays")
	}
}

// A claim found stale may be allocated here again, under the same UID,
// and prepared before its release runs: the release asks the API server
// again under the claim's lock, and leaves it.
func TestReleaseStaleLeavesAClaimAllocatedHereAgain(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	c := claim("c", "g0-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
	stale, err := l.stale.find(r.ctx)
	if err != nil || len(stale) != 1 {
		t.Fatalf("stale %v, %v", stale, err)
	}
	// Allocated here again and prepared, between the check and the
	// release.
	gets := 0
	r.client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		return false, nil, nil
	})
	if _, err := r.client.ResourceV1().ResourceClaims("default").Create(r.ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.stale.release(r.ctx, stale); err != nil {
		t.Fatal(err)
	}
	if gets != 1 {
		t.Errorf("the release asked the API server %d times, want once", gets)
	}
	if again := reserve(r.ctx, l, []*resourceapi.ResourceClaim{c}); again.Fresh[c.UID] || !slices.Equal(again.Entries[c.UID].Devices[0].Seats, []int{0}) {
		t.Errorf("the claim allocated here again lost its seats to the release of its stale past")
	}
}
