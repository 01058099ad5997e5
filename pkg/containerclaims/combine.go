package containerclaims

import (
	"maps"
	"slices"
	"strconv"
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

// NamesEveryGPU reports whether a claim's spec on disk (env, by CDI
// device) names every GPU of a node of nodeGPUs by index in each of its
// devices, as a claim combined over every GPU's does: no other claim a
// container holds beside it can widen it.
func NamesEveryGPU(env map[string]map[string]string, nodeGPUs int) bool {
	every := make([]string, nodeGPUs)
	for i := range every {
		every[i] = strconv.Itoa(i)
	}
	want := strings.Join(every, ",")
	for _, e := range env {
		if e["CUDA_VISIBLE_DEVICES"] != want {
			return false
		}
	}
	return len(env) > 0 && nodeGPUs > 0
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

// Standalone reports whether pods other than one may hold a claim: no pod
// controls it, or several pods reserve it.
func Standalone(c *resourceapi.ResourceClaim) bool {
	return c != nil && (!ownedByPod(c) || len(ReservingPods(c)) > 1)
}

// ReservingPods are the UIDs of the pods the claim is reserved for.
func ReservingPods(c *resourceapi.ResourceClaim) []types.UID {
	var out []types.UID
	for _, ref := range c.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			out = append(out, ref.UID)
		}
	}
	return out
}

// ownedByPod reports whether a pod controls the claim: one made from the
// pod's template, or by the scheduler for its extended resources. No
// other pod references it.
func ownedByPod(claim *resourceapi.ResourceClaim) bool {
	for _, o := range claim.OwnerReferences {
		if o.Kind == "Pod" && o.APIVersion == "v1" && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

// A pod whose containers ask for an extended resource backed by this
// driver (a DeviceClass's extendedResourceName in resources.requests)
// gets one claim that the scheduler makes for the whole pod, annotated
// resource.kubernetes.io/extended-resource-claim: "true", with one
// request per container and resource, named container-<i>-request-<j>:
// i is the container's index among the pod's init containers and then its
// containers, j the resource's among the container's sorted requests
// (kube-scheduler 1.37, dynamicresources/extendeddynamicresources.go,
// createResourceRequestAndMappings). The kubelet gives a container the
// requests that pod.status.extendedResourceClaimStatus maps to it
// (cm/dra GetResources), and for a container or a sidecar those are the
// requests named with its own index; yet its PodResources API lists the
// claim whole for every container with a mapping. Taken whole, such a
// claim with two containers would be combined, and each container would
// name its own GPU by index for no reason.
//
// The plugin reads no pod, so it takes the container from the request's
// name, a convention of the scheduler's and not an API: a claim whose
// requests do not all read that way is taken whole, as any other claim
// (combined when it has several requests). One case the names cannot
// tell: an init container that is not a sidecar may be mapped to the
// requests of containers after it (the scheduler lets it reuse theirs),
// and the kubelet does not list it; holding two of them, it sees the GPUs
// of the request the runtime applies last.

// extendedResourceClaim reports whether the scheduler made the claim for
// a pod's extended resources.
func extendedResourceClaim(c *resourceapi.ResourceClaim) bool {
	return c != nil && c.Annotations[resourceapi.ExtendedResourceClaimAnnotation] == "true"
}

// extendedRequestContainer reads the container index from the name the
// scheduler gives a request of an extended-resource claim.
func extendedRequestContainer(request string) (int, bool) {
	rest, ok := strings.CutPrefix(request, "container-")
	if !ok {
		return 0, false
	}
	i, j, ok := strings.Cut(rest, "-request-")
	if !ok || !digits(i) || !digits(j) {
		return 0, false
	}
	n, err := strconv.Atoi(i)
	return n, err == nil
}

func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// requestGroup is a set of a claim's requests that one container may hold
// together, and the GPUs their devices hold.
type requestGroup struct {
	requests map[string]bool
	gpus     map[int]bool
}

// requestGroups splits c's requests by the containers that may hold them:
// one group for the whole claim, or, for an extended-resource claim
// (perContainer) whose requests all carry the scheduler's names, one
// group per container index. Groups come in the order of their first
// device.
func requestGroups(c *checkpoint.Claim, perContainer bool) []requestGroup {
	if perContainer {
		for _, dev := range c.Devices {
			for _, r := range dev.Requests {
				if _, ok := extendedRequestContainer(r); !ok {
					perContainer = false
				}
			}
		}
	}
	var groups []requestGroup
	index := map[int]int{}
	for _, dev := range c.Devices {
		for _, r := range dev.Requests {
			key := 0
			if perContainer {
				key, _ = extendedRequestContainer(r)
			}
			i, ok := index[key]
			if !ok {
				i = len(groups)
				index[key] = i
				groups = append(groups, requestGroup{requests: map[string]bool{}, gpus: map[int]bool{}})
			}
			groups[i].requests[r] = true
			for _, g := range dev.GPUs {
				groups[i].gpus[g] = true
			}
		}
	}
	return groups
}

// RequestsApart reports whether no container can hold two of c's
// requests, as their names say: every request is named as the scheduler
// names an extended-resource claim's, one per container index. A spec
// whose entry the ledger did not mark combined (one recorded before the
// ledger decided this, or rebuilt without its spec) falls back on it.
func RequestsApart(c *checkpoint.Claim) bool {
	// Names that do not all read so make one group.
	groups := requestGroups(c, true)
	if len(groups) < 2 {
		return false
	}
	for _, g := range groups {
		if len(g.requests) > 1 {
			return false
		}
	}
	return true
}
