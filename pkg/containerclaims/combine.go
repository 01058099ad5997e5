package containerclaims

import (
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// width is how many GPUs a combined spec names; AllGPUs: every GPU of the
// node.
type width struct {
	set bool
	n   int
}

// AllGPUs is the width of a combined claim whose spec names every GPU of
// the node (checkpoint.Claim.CombinedGPUs).
const AllGPUs = 0

func (w *width) widen(n int) {
	if !w.set || w.n != AllGPUs && (n == AllGPUs || n > w.n) {
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
	case c.CombinedGPUs != AllGPUs && (n == AllGPUs || n > c.CombinedGPUs):
		c.CombinedGPUs = n
		return true
	}
	return false
}

// Combine marks the entries of a prepare call's claims (entries, by UID:
// those the ledger recorded; a claim it refused has none) that share a
// container with another of this driver's claims, and the held claims of
// st they share one with. It reports whether an entry changed, and the
// held claims outside the call that it combined or that a container holds
// beside a claim of the call, or beside another held claim in a pod of the
// call: their specs must be written again before the call answers. The
// caller holds the ledger's lock: st is the ledger's record.
func Combine(st *checkpoint.State, call []*resourceapi.ResourceClaim, entries map[types.UID]*checkpoint.Claim, h Holders) (changed bool, widened []types.UID) {
	names := make(map[types.NamespacedName]types.UID, len(call))
	claims := make(map[types.UID]*resourceapi.ResourceClaim, len(call))
	for _, c := range call {
		names[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c.UID
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
	wide := map[types.UID]bool{}
	widenHeld := func(uid types.UID, n int) {
		if _, inCall := claims[uid]; inCall {
			return
		}
		if combineTo(st.Claims[uid], n) {
			changed = true
		}
		wide[uid] = true
	}
	in := func(refs []types.NamespacedName) ([]types.UID, int) {
		return oursIn(refs, names, claims, entries, heldUID, st)
	}
	// Counted over the call's claims, not its entries: a claim that
	// failed here is prepared again with the others, and whether they
	// may share a container does not depend on it.
	several := len(claims) >= 2
	for uid, c := range entries {
		if s := Standalone(claims[uid]); c.Standalone != s {
			c.Standalone, changed = s, true
		}
		var w width
		containers, known := h.Containers[uid]
		switch {
		case !known && (several || c.Standalone || h.Beside[uid]):
			w.widen(AllGPUs)
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
	}
	for _, refs := range h.Pods {
		ours, n := in(refs)
		if len(ours) < 2 {
			continue
		}
		for _, o := range ours {
			widenHeld(o, n)
		}
	}
	for _, name := range h.BesideHeld {
		if uid, ok := heldUID(name); ok {
			widenHeld(uid, AllGPUs)
		}
	}
	return changed, slices.Sorted(maps.Keys(wide))
}

// oursIn finds, among the claims one container references, those of this
// driver (of the call, or held), and the most GPUs they may give the
// container. A claim of the call that failed here (no entry) gives none:
// the kubelet calls again with it before any container starts. Of an
// extended-resource claim the container holds one container's requests,
// which ones is not known: the group that gives the most counts.
func oursIn(refs []types.NamespacedName, call map[types.NamespacedName]types.UID, claims map[types.UID]*resourceapi.ResourceClaim, entries map[types.UID]*checkpoint.Claim, held func(types.NamespacedName) (types.UID, bool), st *checkpoint.State) ([]types.UID, int) {
	var ours []types.UID
	seen := map[int]bool{}
	var choices [][]requestGroup
	for _, ref := range refs {
		if uid, ok := call[ref]; ok {
			if slices.Contains(ours, uid) {
				continue
			}
			ours = append(ours, uid)
			c := entries[uid]
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

// CombinedInSpec reports whether a claim's spec on disk names GPUs as a
// combined claim's does, and how many: by index where its configuration
// says UUIDs, by more indices than its request holds, or by index for a
// claim with several requests that one container may hold together. A
// rebuilt checkpoint's entries take it from the specs on the node.
func CombinedInSpec(c *checkpoint.Claim, env map[string]map[string]string) (int, bool) {
	perRequest := map[string]map[string]bool{}
	for _, dev := range c.Devices {
		reqs := dev.Requests
		if len(reqs) == 0 {
			reqs = []string{""}
		}
		for _, r := range reqs {
			if perRequest[r] == nil {
				perRequest[r] = map[string]bool{}
			}
			for _, u := range dev.GPUUUIDs {
				perRequest[r][u] = true
			}
		}
	}
	most := 0
	for _, gpus := range perRequest {
		most = max(most, len(gpus))
	}
	n, unasked := 0, false
	for name, e := range env {
		v := e["CUDA_VISIBLE_DEVICES"]
		if v == "" || strings.HasPrefix(v, "GPU-") {
			continue
		}
		n = max(n, len(strings.Split(v, ",")))
		i := slices.IndexFunc(c.Devices, func(d checkpoint.Device) bool { return d.CDIDevice == name })
		unasked = unasked || i >= 0 && c.Devices[i].VisibleDevices != string(v1alpha1.VisibleDevicesIndex)
	}
	return n, n > 0 && (unasked || n > most || len(perRequest) > 1 && !RequestsApart(c))
}

// Combined reports whether c's spec names GPUs as a combined claim's
// does. The ledger marks a claim combined where a container holds it
// beside another, or holds several of its requests (Combine). An entry it
// did not mark (recorded before it decided this, or rebuilt with no spec
// to read) is combined where it has several requests that one container
// may hold: all of them, unless their names put each in a container of
// its own (an extended-resource claim's, RequestsApart).
func Combined(c *checkpoint.Claim) bool {
	if c.Combined {
		return true
	}
	requests := map[string]bool{}
	for _, dev := range c.Devices {
		for _, r := range dev.Requests {
			requests[r] = true
		}
	}
	return len(requests) > 1 && !RequestsApart(c)
}
