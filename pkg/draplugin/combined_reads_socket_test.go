package draplugin_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
)

// prepareClient is the plugin's prepare client as kyb-dra-plugin makes
// it: every request waits for client-go's token bucket first, as a REST
// client's does, and is counted; it reaches the API server of the env's
// client, which serves the plugin's background work unlimited (the
// command gives that a client and a limit of its own). It pages a LIST
// of ResourceClaims as the API server does, which the fake one does not.
type prepareClient struct {
	*fake.Clientset
	mu       sync.Mutex
	limiter  flowcontrol.RateLimiter
	requests map[string]int // "verb resource"
	claims   int            // ResourceClaims its answers held
}

// The command's defaults (kyb-dra-plugin --kube-api-qps, --kube-api-burst).
const (
	prepareQPS   = 20
	prepareBurst = 64
)

// withPrepareClient gives the plugin a prepareClient over the env's API
// server, limited to qps and burst.
func withPrepareClient(pc **prepareClient, qps float32, burst int) envOption {
	return func(e *env) {
		c := &prepareClient{Clientset: fake.NewClientset(), requests: map[string]int{}}
		c.reset(qps, burst)
		api := e.client
		c.PrependReactor("*", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
			c.charge(action)
			obj, err := api.Invokes(action, nil)
			if l, ok := action.(k8stesting.ListActionImpl); ok && err == nil {
				obj = page(obj, l.ListOptions)
			}
			c.count(obj)
			return true, obj, err
		})
		c.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
			c.charge(action)
			w, err := api.InvokesWatch(action)
			return true, w, err
		})
		*pc = c
		prev := e.opts
		e.opts = func(o *draplugin.Options) {
			if prev != nil {
				prev(o)
			}
			o.Client, o.BackgroundClient = c, api
		}
	}
}

// charge waits for a token and counts the request.
func (c *prepareClient) charge(action k8stesting.Action) {
	c.mu.Lock()
	limiter := c.limiter
	c.requests[action.GetVerb()+" "+action.GetResource().Resource]++
	c.mu.Unlock()
	limiter.Accept()
}

// count counts the ResourceClaims of an answer.
func (c *prepareClient) count(obj runtime.Object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch o := obj.(type) {
	case *resourceapi.ResourceClaimList:
		c.claims += len(o.Items)
	case *resourceapi.ResourceClaim:
		c.claims++
	}
}

// page answers a LIST of ResourceClaims with a limit as the API server
// does: in name order (the order of its storage keys within a namespace),
// at most Limit claims from the continue token on, with a token for the
// rest.
func page(obj runtime.Object, opts metav1.ListOptions) runtime.Object {
	list, ok := obj.(*resourceapi.ResourceClaimList)
	if !ok || opts.Limit <= 0 {
		return obj
	}
	items := slices.Clone(list.Items)
	slices.SortFunc(items, func(a, b resourceapi.ResourceClaim) int { return strings.Compare(a.Name, b.Name) })
	if opts.Continue != "" {
		i := slices.IndexFunc(items, func(c resourceapi.ResourceClaim) bool { return c.Name > opts.Continue })
		if i < 0 {
			i = len(items)
		}
		items = items[i:]
	}
	out := list.DeepCopy()
	if int64(len(items)) > opts.Limit {
		rest := int64(len(items)) - opts.Limit
		items = items[:opts.Limit]
		out.Continue = items[len(items)-1].Name
		out.RemainingItemCount = &rest
	}
	out.Items = items
	return out
}

// reset gives the client a full bucket and forgets what it counted.
func (c *prepareClient) reset(qps float32, burst int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	clear(c.requests)
	c.claims = 0
}

// claimsRead are the ResourceClaims the client's answers held since the
// last reset.
func (c *prepareClient) claimsRead() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claims
}

// claimReads are the reads of ResourceClaims counted since the last reset.
func (c *prepareClient) claimReads() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests["get resourceclaims"] + c.requests["list resourceclaims"]
}

// total is every request counted since the last reset.
func (c *prepareClient) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.requests {
		n += v
	}
	return n
}

// Where the kubelet cannot say who holds a claim, a prepare reads the
// reservations of the standalone claims the node holds in the claim's
// namespace: in one read, however many there are. Sixteen one-seat
// standalone claims, each of a pod of its own, prepared one after another
// read the API server at most twice each (the claim, and the standalone
// claims' reservations), not once per claim the node holds. A pod that
// references one of them beside a claim of its own still gets that claim
// combined, and one that references none keeps its GPU's UUID.
func TestAPrepareReadsAsManyClaimsWhateverTheNodeHolds(t *testing.T) {
	var api *prepareClient
	e := newEnv(t, "nvlink-2x4", seed, withPrepareClient(&api, 1000, 1000))
	var held []*resourceapi.ResourceClaim
	var reads []int
	for i := range 16 {
		c := e.reserveFor(e.standaloneClaim(class1x), fmt.Sprintf("pod-%d", i))
		api.reset(1000, 1000)
		e.prepareOK(c)
		reads = append(reads, api.claimReads())
		held = append(held, c)
	}
	for i, n := range reads {
		if n > 2 {
			t.Errorf("claim reads of each prepare, the node holding 0, 1, ... 15 standalone claims: %v; want at most 2 each (prepare %d read %d)", reads, i+1, n)
			break
		}
	}

	// pod-7 references its standalone claim and a 1x claim of its own.
	own := e.reserveFor(e.claim(class1x), "pod-7")
	api.reset(1000, 1000)
	ownIDs := e.prepareOK(own)
	if n := api.claimReads(); n > 2 {
		t.Errorf("the prepare of a pod's own claim beside 16 standalone ones read %d claims, want at most 2", n)
	}
	if env, _ := e.container(ownIDs...); env["CUDA_VISIBLE_DEVICES"] != "0,1,2,3,4,5,6,7" {
		t.Errorf("a claim whose pod also references a standalone claim the node holds: CUDA_VISIBLE_DEVICES=%s, want every GPU by index", env["CUDA_VISIBLE_DEVICES"])
	}
	// Gone from the API server, a standalone claim is referenced by no
	// pod; the others are still read.
	if err := e.client.ResourceV1().ResourceClaims(held[3].Namespace).Delete(e.ctx, held[3].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	unrelated := e.reserveFor(e.claim(class1x), "pod-other")
	api.reset(1000, 1000)
	unrelatedIDs := e.prepareOK(unrelated)
	if env, devs := e.container(unrelatedIDs...); env["CUDA_VISIBLE_DEVICES"] != strings.Join(e.gpusOf(devs), ",") {
		t.Errorf("a claim whose pod references no standalone claim: CUDA_VISIBLE_DEVICES=%s, want its own GPU's UUID %s", env["CUDA_VISIBLE_DEVICES"], strings.Join(e.gpusOf(devs), ","))
	}
	if n := api.claimReads(); n > 2 {
		t.Errorf("a prepare read %d claims, want at most 2", n)
	}
}

// The reservations of the standalone claims a node holds are read without
// reading the rest of their namespace: a namespace holds the claims of
// every node of the cluster, thousands in a large one, and any tenant
// with the right to create claims there adds to them. Where the kubelet
// cannot say who holds a claim, a prepare beside two standalone claims
// the node holds reads as many claims in a namespace of 503 as in one of
// 2,004: one LIST page and its own claim.
func TestAPrepareDoesNotReadTheWholeNamespace(t *testing.T) {
	var api *prepareClient
	e := newEnv(t, "nvlink-2x4", seed, withPrepareClient(&api, 1000, 1000))
	for i := range 2 {
		e.prepareOK(e.reserveFor(e.standaloneClaim(class1x), fmt.Sprintf("pod-s%d", i)))
	}
	// Claims of other nodes' pods in the same namespace.
	others := 0
	grow := func(n int) {
		for range n {
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("other-node-claim-%d", others)}}
			if _, err := e.client.ResourceV1().ResourceClaims("default").Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			others++
		}
	}
	var read, size []int
	for i, n := range []int{500, 1500} {
		grow(n)
		api.reset(1000, 1000)
		e.prepareOK(e.reserveFor(e.claim(class1x), fmt.Sprintf("pod-new-%d", i)))
		read = append(read, api.claimsRead())
		size = append(size, others+2+i+1) // and the held ones, the call's
	}
	// The page: 100 claims (containerclaims' listPage), the call's claim.
	if read[0] > 101 || read[1] != read[0] {
		t.Errorf("a prepare beside 2 standalone claims of the node read %d claims of a namespace of %d and %d of one of %d; want one page of at most 100 and its own claim, whatever the namespace holds", read[0], size[0], read[1], size[1])
	}
}
