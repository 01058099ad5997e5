package seatledger

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containerclaims"
)

func nameOf(c *resourceapi.ResourceClaim) types.NamespacedName {
	return types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
}

// reserveFor is reserve with the claims' holders known.
func reserveFor(r *rig, l *Ledger, claims []*resourceapi.ResourceClaim, containers map[types.UID][][]types.NamespacedName) reserved {
	res := l.ReserveFor(r.ctx, claims, containerclaims.Holders{Containers: containers})
	res.Done()
	return byClaim(res)
}

// With the holders known, a claim is combined only where a container
// holds it beside another of the driver's claims, or where it has several
// requests, and its spec names as many GPUs as the most any of its
// containers sees; a held claim a later container holds beside a new one
// is combined too (and its spec owed again), its count only growing. A
// standalone claim alone in its containers keeps its UUIDs.
func TestCombineWithKnownHolders(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	defer l.Close(r.ctx)
	entry := func(uid types.UID) checkpoint.Claim {
		t.Helper()
		for _, c := range l.Prepared() {
			if c.Name == string(uid)[len("uid-"):] {
				return *c
			}
		}
		t.Fatalf("no entry %s", uid)
		return checkpoint.Claim{}
	}
	check := func(what string, uid types.UID, combined bool, n int) {
		t.Helper()
		if c := entry(uid); c.Combined != combined || c.CombinedGPUs != n {
			t.Errorf("%s: combined %v over %d GPUs, want %v over %d", what, c.Combined, c.CombinedGPUs, combined, n)
		}
	}

	// A standalone claim (no owner) that one pod's container holds alone.
	shared := claim("shared", "g0-1x")
	res := reserveFor(r, l, []*resourceapi.ResourceClaim{shared}, map[types.UID][][]types.NamespacedName{
		shared.UID: {{nameOf(shared)}},
	})
	check("a standalone claim alone in its container", shared.UID, false, 0)
	if len(res.Widened) != 0 {
		t.Errorf("widened %v", res.Widened)
	}

	// Two claims of one call, each alone in its container.
	a, b := podClaim("a", "g1-1x"), podClaim("b", "g23-2x")
	reserveFor(r, l, []*resourceapi.ResourceClaim{a, b}, map[types.UID][][]types.NamespacedName{
		a.UID: {{nameOf(a)}}, b.UID: {{nameOf(b)}},
	})
	check("a claim of a call of two, alone in its container", a.UID, false, 0)
	check("its partner, alone in another", b.UID, false, 0)

	// A later pod's container holds the standalone claim beside its own
	// 2x claim (and another driver's claim): three GPUs.
	later := podClaim("later", "g45-2x")
	nic := types.NamespacedName{Namespace: "default", Name: "nic"}
	res = reserveFor(r, l, []*resourceapi.ResourceClaim{later}, map[types.UID][][]types.NamespacedName{
		later.UID: {{nameOf(shared), nameOf(later), nic}},
	})
	check("a claim held beside a standalone one", later.UID, true, 3)
	check("the standalone one, held beside it now", shared.UID, true, 3)
	if !slices.Equal(res.Widened, []types.UID{shared.UID}) {
		t.Errorf("widened %v, want the standalone claim", res.Widened)
	}

	// Another pod holds it beside a 1x claim: two GPUs, fewer than it
	// names already.
	small := podClaim("small", "g6-1x")
	res = reserveFor(r, l, []*resourceapi.ResourceClaim{small}, map[types.UID][][]types.NamespacedName{
		small.UID: {{nameOf(shared), nameOf(small)}},
	})
	check("a 1x claim beside the standalone one", small.UID, true, 2)
	check("the standalone one keeps naming three", shared.UID, true, 3)
	if !slices.Equal(res.Widened, []types.UID{shared.UID}) {
		t.Errorf("widened %v: the standalone claim's spec is owed again at each such prepare", res.Widened)
	}

	// A claim with two requests of one GPU each, alone in its container.
	pair := podClaim("pair", "g7-1x", "g7-1x")
	pair.Status.Allocation.Devices.Results[1].Request = "second"
	reserveFor(r, l, []*resourceapi.ResourceClaim{pair}, map[types.UID][][]types.NamespacedName{
		pair.UID: {{nameOf(pair)}},
	})
	check("a claim with two requests", pair.UID, true, 1)
}

// Where the kubelet could not name a claim's holders, the claim is
// decided conservatively, and a standalone claim its pod references is
// combined over every GPU of the node, whatever it named before.
func TestCombineConservativeWidensTheStandaloneClaimBeside(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	defer l.Close(r.ctx)
	shared := claim("shared", "g0-1x")
	reserveFor(r, l, []*resourceapi.ResourceClaim{shared}, map[types.UID][][]types.NamespacedName{shared.UID: {{nameOf(shared)}}})
	own := podClaim("own", "g1-1x")
	res := byClaim(l.ReserveFor(r.ctx, []*resourceapi.ResourceClaim{own}, containerclaims.Holders{Beside: map[types.UID]bool{own.UID: true}, BesideHeld: []types.NamespacedName{nameOf(shared)}}))
	res.Done()
	if c := res.Entries[own.UID]; c == nil || !c.Combined || c.CombinedGPUs != containerclaims.AllGPUs {
		t.Errorf("the pod's own claim: %+v", c)
	}
	if !slices.Equal(res.Widened, []types.UID{shared.UID}) {
		t.Errorf("widened %v, want the standalone claim", res.Widened)
	}
	for _, c := range l.Prepared() {
		if c.Name == "shared" && (!c.Combined || c.CombinedGPUs != containerclaims.AllGPUs) {
			t.Errorf("the standalone claim: combined %v over %d", c.Combined, c.CombinedGPUs)
		}
	}
}

// With the holders known, an extended-resource claim is combined only
// where one container holds several of its requests (over their GPUs), or
// holds it beside another claim (over the most GPUs its requests and the
// other claim give).
func TestCombineExtendedResourceClaim(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	defer l.Close(r.ctx)
	extended := func(name string, requests []string, devices ...string) *resourceapi.ResourceClaim {
		c := podClaim(name, devices...)
		c.Annotations = map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}
		for i := range c.Status.Allocation.Devices.Results {
			c.Status.Allocation.Devices.Results[i].Request = requests[i]
		}
		return c
	}
	for _, tc := range []struct {
		name     string
		claim    *resourceapi.ResourceClaim
		beside   *resourceapi.ResourceClaim
		combined bool
		n        int
	}{
		{name: "one request per container",
			claim: extended("apart", []string{"container-0-request-0", "container-1-request-0"}, "g0-1x", "g1-1x")},
		{name: "two requests of one container",
			claim:    extended("together", []string{"container-0-request-0", "container-0-request-1", "container-1-request-0"}, "g23-2x", "g45-2x", "g6-1x"),
			combined: true, n: 4},
		{name: "names not the scheduler's",
			claim:    extended("named", []string{"a", "b"}, "g7-1x", "g0-1x"),
			combined: true, n: 2},
		{name: "beside another claim",
			claim:  extended("beside", []string{"container-0-request-0", "container-1-request-0"}, "g1-1x", "g23-2x"),
			beside: podClaim("other", "g45-2x"), combined: true, n: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claims := []*resourceapi.ResourceClaim{tc.claim}
			refs := []types.NamespacedName{nameOf(tc.claim)}
			if tc.beside != nil {
				claims = append(claims, tc.beside)
				refs = append(refs, nameOf(tc.beside))
			}
			containers := map[types.UID][][]types.NamespacedName{tc.claim.UID: {refs, {nameOf(tc.claim)}}}
			res := reserveFor(r, l, claims, containers)
			c := res.Entries[tc.claim.UID]
			if c == nil {
				t.Fatalf("not prepared: %v", res.Errs[tc.claim.UID])
			}
			if c.Combined != tc.combined || c.CombinedGPUs != tc.n {
				t.Errorf("combined %v over %d GPUs, want %v over %d", c.Combined, c.CombinedGPUs, tc.combined, tc.n)
			}
			if _, err := l.Release(r.ctx, []types.UID{tc.claim.UID}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
