package containerclaims

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// Which containers hold a claim beside another of this driver's decides
// how its spec names GPUs (Combine). The kubelet
// knows: it adds all of a pod's claims to its claim cache before it calls
// any driver to prepare them, so its PodResources API (v1 Get) lists each
// container of a pod with the claims it references while the prepare
// runs. The plugin asks it once per pod reserving a claim of the call,
// with a short timeout, and only where it matters: not for a call of one
// claim on a node that holds no other claim of this driver (no container
// can hold two then). Where the kubelet cannot answer (no socket, an
// error, a pod it does not know yet, or a pod none of whose containers it
// lists with the claim: claims it has not cached yet), the claim is
// decided as before the kubelet was asked, conservatively, and the plugin
// logs why, once per claim.

// podResourcesTimeout bounds the kubelet's answer for one pod on the
// prepare path: it answers from memory, in microseconds.
const podResourcesTimeout = time.Second

// Held is what the finder reads of the seat ledger: which claims the node
// holds (seatledger.Ledger).
type Held interface {
	// PreparedUIDs are the UIDs of the recorded claims.
	PreparedUIDs() []types.UID
	// StandaloneClaims are the standalone claims the node holds.
	StandaloneClaims(ctx context.Context) ([]HeldClaim, error)
}

// HeldClaim is a standalone claim the node holds.
type HeldClaim struct {
	types.NamespacedName
	// EveryGPU says its spec on the node names every GPU of the node by
	// index (NamesEveryGPU), the widest a spec gets: found beside a claim
	// of a call, it needs nothing more.
	EveryGPU bool
}

// Finder finds the containers that hold a prepare call's claims: it asks
// the kubelet (pods, nil where the plugin has no PodResources socket),
// and where the kubelet cannot say, the API server (claims) about the
// standalone claims the node holds (held).
type Finder struct {
	pods   podresources.ClaimsReader
	claims resourceclient.ResourceClaimsGetter
	held   Held
	// fallback logs the claims whose holders the kubelet could not name.
	fallback fallbackLog
}

// NewFinder returns a finder asking pods and claims about what held holds.
func NewFinder(pods podresources.ClaimsReader, claims resourceclient.ResourceClaimsGetter, held Held) *Finder {
	return &Finder{pods: pods, claims: claims, held: held}
}

// Holders finds the containers that hold the call's claims.
func (f *Finder) Holders(ctx context.Context, claims []*resourceapi.ResourceClaim) Holders {
	h := Holders{Containers: map[types.UID][][]types.NamespacedName{}}
	if len(claims) == 1 && !f.holdsOtherThan(claims[0].UID) {
		c := claims[0]
		h.Containers[c.UID] = [][]types.NamespacedName{{{Namespace: c.Namespace, Name: c.Name}}}
		return h
	}
	var unknown []*resourceapi.ResourceClaim
	answers := map[types.NamespacedName]podAnswer{}
	for _, claim := range claims {
		containers, why := f.claimHolders(ctx, claim, answers)
		if why != "" {
			f.fallback.note(ctx, claim, why)
			unknown = append(unknown, claim)
			continue
		}
		h.Containers[claim.UID] = containers
	}
	// Every container of the pods asked about, also those holding none of
	// the call's claims: one may hold two claims prepared before.
	for _, key := range slices.SortedFunc(maps.Keys(answers), func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) }) {
		if a := answers[key]; a.err == nil {
			for _, ctr := range a.pod.Containers {
				h.Pods = append(h.Pods, ctr.Claims)
			}
		}
	}
	if len(unknown) > 0 {
		h.Beside, h.BesideHeld = f.besideStandalone(ctx, unknown, len(claims) >= 2)
	}
	return h
}

// podAnswer is the kubelet's answer for one pod.
type podAnswer struct {
	pod podresources.PodClaims
	err error
}

// claimHolders lists the containers of the pods reserving claim that
// reference it, each as the claims it references; why says why that
// cannot be known.
func (f *Finder) claimHolders(ctx context.Context, claim *resourceapi.ResourceClaim, answers map[types.NamespacedName]podAnswer) ([][]types.NamespacedName, string) {
	if f.pods == nil {
		return nil, "no PodResources socket is configured"
	}
	name := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
	var containers [][]types.NamespacedName
	pods := 0
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource != "pods" || ref.APIGroup != "" {
			continue
		}
		pods++
		key := types.NamespacedName{Namespace: claim.Namespace, Name: ref.Name}
		a, asked := answers[key]
		if !asked {
			a.pod, a.err = f.podClaims(ctx, key)
			answers[key] = a
		}
		if a.err != nil {
			return nil, a.err.Error()
		}
		if !a.pod.References(name) {
			return nil, fmt.Sprintf("the kubelet lists no container of pod %s referencing the claim (it has not cached the pod's claims yet)", key)
		}
		for _, ctr := range a.pod.Containers {
			if slices.Contains(ctr.Claims, name) {
				containers = append(containers, ctr.Claims)
			}
		}
	}
	if pods == 0 {
		return nil, "the claim is reserved for no pod"
	}
	return containers, ""
}

// podClaims asks the kubelet for one pod's claims, within
// podResourcesTimeout. The kubelet rate-limits its PodResources server as
// a whole, for every client on the node (1.37: a burst of 10, then 100 a
// second), and refuses a call over the limit at once: in a burst of pod
// starts, more than ten prepares ask within a few milliseconds. A refused
// call is made again once a token is back rather than deciding the claim
// the conservative way.
func (f *Finder) podClaims(ctx context.Context, key types.NamespacedName) (podresources.PodClaims, error) {
	ctx, cancel := context.WithTimeout(ctx, podResourcesTimeout)
	defer cancel()
	wait := podResourcesRetry
	for {
		pod, err := f.pods.PodClaims(ctx, key.Namespace, key.Name)
		if err == nil || !podresources.RateLimited(err) {
			return pod, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return pod, err
		case <-t.C:
		}
		wait = min(2*wait, podResourcesRetryMax)
	}
}

// podResourcesRetry and podResourcesRetryMax space the calls the kubelet
// refused for its rate limit: a token comes back every 10 ms at its
// default rate.
const (
	podResourcesRetry    = 10 * time.Millisecond
	podResourcesRetryMax = 100 * time.Millisecond
)

// holdsOtherThan reports whether the node holds a claim of this driver
// other than uid.
func (f *Finder) holdsOtherThan(uid types.UID) bool {
	for _, c := range f.held.PreparedUIDs() {
		if c != uid {
			return true
		}
	}
	return false
}

// fallbackLog logs once per claim why its holders are not known.
type fallbackLog struct {
	mu     sync.Mutex
	logged map[types.UID]bool
}

// fallbackLogLimit bounds the claims remembered; past it, a claim may be
// logged again.
const fallbackLogLimit = 4096

func (f *fallbackLog) note(ctx context.Context, claim *resourceapi.ResourceClaim, why string) {
	f.mu.Lock()
	seen := f.logged[claim.UID]
	if !seen {
		if f.logged == nil || len(f.logged) >= fallbackLogLimit {
			f.logged = map[types.UID]bool{}
		}
		f.logged[claim.UID] = true
	}
	f.mu.Unlock()
	if !seen {
		klog.FromContext(ctx).Info("Cannot tell which containers hold the claim; it names GPUs by index over the node's if it may share a container", "claim", klog.KObj(claim), "why", why)
	}
}

// besideStandalone decides the claims whose holders are not known the
// conservative way: it finds those whose pods also reference a standalone
// claim the node holds (the kubelet leaves that one out of the call,
// having prepared it for another pod, yet one of the pod's containers may
// hold both), and those standalone claims. Only on a node holding
// standalone claims in the call's namespace, whose reservations it reads
// (standaloneReservations). A claim that cannot be read counts as
// referenced, so the specs err on the side that is right for every
// container.
//
// It reads only what can change a spec: a claim of the call that is
// combined over every GPU whatever its pod references (its call holds
// several claims, or it is standalone) needs no answer, and neither does
// a held claim whose spec names every GPU already. So a run of standalone
// claims prepared one after another, each combined so at its own prepare,
// reads none of them, however many the node holds. Whether a spec names
// every GPU is read from the spec on disk (HeldClaim.EveryGPU): it is what
// containers get, and a rewrite that failed may have left it behind what
// the ledger recorded.
func (f *Finder) besideStandalone(ctx context.Context, claims []*resourceapi.ResourceClaim, several bool) (map[types.UID]bool, []types.NamespacedName) {
	held, err := f.held.StandaloneClaims(ctx)
	if err != nil || len(held) == 0 {
		// The reservation reports a checkpoint that cannot be read.
		return nil, nil
	}
	// Combined over every GPU whatever its pod references (Combine).
	wide := func(c *resourceapi.ResourceClaim) bool { return several || Standalone(c) }
	// A pod references claims of its own namespace only.
	candidates := map[string][]string{}
	for _, h := range held {
		if slices.ContainsFunc(claims, func(c *resourceapi.ResourceClaim) bool {
			return c.Namespace == h.Namespace && c.Name != h.Name && (!h.EveryGPU || !wide(c))
		}) {
			candidates[h.Namespace] = append(candidates[h.Namespace], h.Name)
		}
	}
	logger := klog.FromContext(ctx)
	beside := map[types.UID]bool{}
	var besideHeld []types.NamespacedName
	for _, ns := range slices.Sorted(maps.Keys(candidates)) {
		names := candidates[ns]
		slices.Sort(names)
		reserving, err := f.standaloneReservations(ctx, ns, names)
		for _, name := range names {
			pods, found := reserving[name]
			if err == nil && !found {
				continue // gone: no pod references it now
			}
			h := types.NamespacedName{Namespace: ns, Name: name}
			for _, c := range claims {
				if c.Namespace != ns || c.Name == name {
					continue
				}
				switch {
				case err != nil:
					logger.Info("Cannot read a standalone claim the node holds; preparing the claim as if its pod referenced it", "standalone", klog.KRef(ns, name), "claim", klog.KObj(c), "err", err)
				case slices.ContainsFunc(pods, func(uid types.UID) bool { return slices.Contains(ReservingPods(c), uid) }):
					logger.V(2).Info("The claim's pod also references a standalone claim the node holds: its containers may hold both", "claim", klog.KObj(c), "standalone", klog.KRef(ns, name))
				default:
					continue
				}
				beside[c.UID] = true
				if !slices.Contains(besideHeld, h) {
					besideHeld = append(besideHeld, h)
				}
			}
		}
	}
	return beside, besideHeld
}

// standaloneReservations reads which pods reserve the named standalone
// claims of namespace ns now (a pod that references one beside a claim of
// its own was added to its reservations after its prepare, which the
// kubelet does not repeat), by name; a claim that is gone is left out.
//
// What it reads does not grow with the namespace, which holds every
// node's claims and grows with whatever its tenants create: a GET for one
// claim; for several, one LIST page of at most listPage claims, in name
// order as the API server lists them, and a GET for each named claim that
// sorts past a page the namespace did not fit in. In a namespace of up to
// listPage claims that is one request whatever the node holds (a GET for
// each claim made every prepare's requests, through the plugin's
// rate-limited client, grow with the standalone claims the node holds, and
// a run of prepares quadratic); past it, at most one more per named claim.
// All are consistent reads, as the reservation of the pod being prepared
// needs.
func (f *Finder) standaloneReservations(ctx context.Context, ns string, names []string) (map[string][]types.UID, error) {
	api := f.claims.ResourceClaims(ns)
	out := make(map[string][]types.UID, len(names))
	get := func(name string) error {
		c, err := api.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		out[c.Name] = ReservingPods(c)
		return nil
	}
	if len(names) == 1 {
		if err := get(names[0]); err != nil {
			return nil, err
		}
		return out, nil
	}
	page, err := api.List(ctx, metav1.ListOptions{Limit: listPage})
	if err != nil {
		return nil, fmt.Errorf("list the claims of namespace %s: %w", ns, err)
	}
	last := ""
	for i := range page.Items {
		c := &page.Items[i]
		last = max(last, c.Name)
		if slices.Contains(names, c.Name) {
			out[c.Name] = ReservingPods(c)
		}
	}
	if page.Continue == "" {
		return out, nil
	}
	// A name the page did not reach may still be there.
	for _, name := range names {
		if _, seen := out[name]; !seen && name > last {
			if err := get(name); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// listPage bounds the claims one LIST answers (ListOptions.Limit): a
// namespace of this many claims is read in one request, and no prepare
// reads more of one, however large it grows.
const listPage = 100
