package seatledger

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// A container that holds two of this driver's claims gets the spec of
// each, and the runtime keeps the environment of the last one it applies:
// each claim's own UUIDs would hide the other's GPUs. Such claims are
// combined: their specs name GPUs by index, CUDA_VISIBLE_DEVICES=0..n-1
// in PCI order, which is right whichever spec comes last, because the
// device nodes decide what CUDA can open and it stops at the first index
// past them. n is the most GPUs any container holding the claim sees with
// its other claims: a spec is shared by every container that uses the
// request, and software that counts the entries must not count more GPUs
// than it has.
//
// Which containers hold which claims is in the pods' specs, not in the
// prepare call; the plugin asks the kubelet's PodResources API (Holders,
// filled in by the caller). It names claims whole, so a container that
// references a claim with several requests counts as holding them all,
// and such a claim is combined; except an extended-resource claim, whose
// requests are each one container's (see requestGroups). A held claim
// that a container of a later pod holds beside a new one, or beside
// another held claim, is combined from then on, and its spec is written
// again before that pod's prepare answers (Widened). A combined claim
// stays combined, and its n only grows: a spec a container already read
// is never narrowed under it. So a claim of the call that fails adds no
// GPU to its partners' n: the kubelet marks a pod's claims prepared only
// once the whole call succeeded, and calls again with all of them before
// any container starts; that call counts them.
//
// Where the kubelet could not say (Holders lacks the claim), the rule is
// the conservative one that needs no pod: the kubelet prepares a pod's
// claims for a driver in one call, leaving out only those it prepared
// before for another pod, and only a standalone claim can be one of
// those. So a claim is combined, over every GPU of the node, when its call
// holds several claims, when it is standalone, or when its pod references
// a standalone claim the node holds (Holders.Beside; that one is combined
// too); and, over its own GPUs, when one container may hold several of
// its requests.

// Holders are the containers that hold the claims of a prepare call.
type Holders struct {
	// Containers are, for each claim of the call whose holders the
	// kubelet named, the containers of the pods reserving it that
	// reference it, each as every claim it references (any driver's).
	Containers map[types.UID][][]types.NamespacedName
	// Pods are every container of the pods the kubelet named them for,
	// each as every claim it references: a container holding none of the
	// call's claims may hold two held claims, which no call of their own
	// will combine (the kubelet prepares them no more).
	Pods [][]types.NamespacedName
	// Beside marks claims of the call, decided conservatively, whose pod
	// also references a standalone claim the node holds: BesideHeld.
	Beside     map[types.UID]bool
	BesideHeld []types.NamespacedName
}

// width is how many GPUs a combined spec names; allGPUs: every GPU of the
// node.
type width struct {
	set bool
	n   int
}

const allGPUs = 0

func (w *width) widen(n int) {
	if !w.set || w.n != allGPUs && (n == allGPUs || n > w.n) {
		w.set, w.n = true, n
	}
}

// combineTo marks c combined, naming at least n GPUs; it reports whether
// c changed.
func combineTo(c *checkpoint.Claim, n int) bool {
	switch {
	case !c.Combined:
		c.Combined, c.CombinedGPUs = true, n
		return true
	case c.CombinedGPUs != allGPUs && (n == allGPUs || n > c.CombinedGPUs):
		c.CombinedGPUs = n
		return true
	}
	return false
}

// combine marks the claims of the reservation that share a container
// with another of this driver's claims, and the held claims they share
// one with. Claims recorded before and sent again get their spec written
// again whenever they are combined (a rewrite that failed, or a crash
// after the save, is not left behind); so do held claims a container
// holds beside one of the call, or beside another held claim in a pod of
// the call (Widened). It reports whether an entry changed. Call with the
// ledger's lock held.
func (r *Reservation) combine(st *checkpoint.State) bool {
	call := make(map[types.NamespacedName]types.UID, len(r.claims))
	claims := make(map[types.UID]*resourceapi.ResourceClaim, len(r.claims))
	for _, c := range r.claims {
		call[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c.UID
		claims[c.UID] = c
	}
	var held map[types.NamespacedName]types.UID
	heldUID := func(name types.NamespacedName) (types.UID, bool) {
		if held == nil {
			held = map[types.NamespacedName]types.UID{}
			for uid, c := range st.Claims {
				held[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = uid
			}
		}
		uid, ok := held[name]
		return uid, ok && !st.Claims[uid].Fenced()
	}
	changed := false
	widened := map[types.UID]bool{}
	widenHeld := func(uid types.UID, n int) {
		if _, inCall := claims[uid]; inCall {
			return
		}
		if combineTo(st.Claims[uid], n) {
			changed = true
		}
		widened[uid] = true
	}
	in := func(refs []types.NamespacedName) ([]types.UID, int) {
		return r.oursIn(refs, call, claims, heldUID, st)
	}
	// Counted over the call's claims, not its entries: a claim that
	// failed here is prepared again with the others, and whether they
	// may share a container does not depend on it.
	several := len(claims) >= 2
	for uid, c := range r.Entries {
		if s := Standalone(claims[uid]); c.Standalone != s {
			c.Standalone, changed = s, true
		}
		var w width
		containers, known := r.holders.Containers[uid]
		switch {
		case !known && (several || c.Standalone || r.holders.Beside[uid]):
			w.widen(allGPUs)
		default:
			for _, g := range requestGroups(c, extendedResourceClaim(claims[uid])) {
				if len(g.requests) > 1 {
					w.widen(len(g.gpus))
				}
			}
		}
		for _, refs := range containers {
			ours, n := in(refs)
			if len(ours) < 2 {
				continue
			}
			w.widen(n)
			for _, o := range ours {
				widenHeld(o, n)
			}
		}
		if w.set && combineTo(c, w.n) {
			changed = true
		}
		if !r.Fresh[uid] && c.Combined {
			r.Rewrite[uid] = true
		}
	}
	for _, refs := range r.holders.Pods {
		ours, n := in(refs)
		if len(ours) < 2 {
			continue
		}
		for _, o := range ours {
			widenHeld(o, n)
		}
	}
	for _, name := range r.holders.BesideHeld {
		if uid, ok := heldUID(name); ok {
			widenHeld(uid, allGPUs)
		}
	}
	r.Widened = slices.Sorted(maps.Keys(widened))
	return changed
}

// oursIn finds, among the claims one container references, those of this
// driver (of the call, or held), and the most GPUs they may give the
// container. A claim of the call that failed here (no entry) gives none:
// the kubelet calls again with it before any container starts. Of an
// extended-resource claim the container holds one container's requests,
// which ones is not known: the group that gives the most counts.
func (r *Reservation) oursIn(refs []types.NamespacedName, call map[types.NamespacedName]types.UID, claims map[types.UID]*resourceapi.ResourceClaim, held func(types.NamespacedName) (types.UID, bool), st *checkpoint.State) ([]types.UID, int) {
	var ours []types.UID
	seen := map[int]bool{}
	var choices [][]requestGroup
	for _, ref := range refs {
		if uid, ok := call[ref]; ok {
			if slices.Contains(ours, uid) {
				continue
			}
			ours = append(ours, uid)
			c := r.Entries[uid]
			if c == nil {
				continue
			}
			if groups := requestGroups(c, extendedResourceClaim(claims[uid])); len(groups) > 1 {
				choices = append(choices, groups)
			} else {
				gpus(c, seen)
			}
			continue
		}
		if uid, ok := held(ref); ok && !slices.Contains(ours, uid) {
			ours = append(ours, uid)
			gpus(st.Claims[uid], seen)
		}
	}
	return ours, widest(seen, choices)
}

// widest is the most GPUs seen and one group of each choice give
// together.
func widest(seen map[int]bool, choices [][]requestGroup) int {
	if len(choices) == 0 {
		return len(seen)
	}
	most := 0
	for _, g := range choices[0] {
		with := maps.Clone(seen)
		maps.Copy(with, g.gpus)
		most = max(most, widest(with, choices[1:]))
	}
	return most
}

// gpus adds the GPUs of c's devices to seen (a new set where nil) and
// returns how many seen holds.
func gpus(c *checkpoint.Claim, seen map[int]bool) int {
	if seen == nil {
		seen = map[int]bool{}
	}
	for _, dev := range c.Devices {
		for _, g := range dev.GPUs {
			seen[g] = true
		}
	}
	return len(seen)
}

// RewriteSpecs writes again the specs of held claims whose entries a
// prepare of other claims combined (Reservation.Widened), each under its
// claim's lock, from its entry as recorded now; a claim released or
// fenced meanwhile is skipped. Call it after the reservation's Done: a
// prepare holds its own claims' locks, and another may hold these.
func (l *Ledger) RewriteSpecs(ctx context.Context, uids []types.UID) error {
	var failed []string
	for _, uid := range uids {
		if err := l.rewriteSpec(uid); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot write again the CDI spec of a claim now held beside another in one container", "uid", uid)
			failed = append(failed, fmt.Sprintf("%s: %v", uid, err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("write again the CDI specs of claims a container holds beside this one: %s", strings.Join(failed, "; "))
	}
	return nil
}

func (l *Ledger) rewriteSpec(uid types.UID) error {
	defer l.claims.lock([]types.UID{uid})()
	l.rec.mu.Lock()
	var c *checkpoint.Claim
	if l.rec.st != nil {
		if e := l.rec.st.Claims[uid]; e != nil && !e.Fenced() && e.Phase == checkpoint.PrepareCompleted {
			copied := *e
			c = &copied
		}
	}
	l.rec.mu.Unlock()
	if c == nil {
		return nil
	}
	return l.opts.Specs.Write(uid, c)
}
