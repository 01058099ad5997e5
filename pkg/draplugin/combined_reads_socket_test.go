package draplugin_test

import (
	"fmt"
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
// command gives that a client and a limit of its own).
type prepareClient struct {
	*fake.Clientset
	mu       sync.Mutex
	limiter  flowcontrol.RateLimiter
	requests map[string]int // "verb resource"
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

// reset gives the client a full bucket and forgets what it counted.
func (c *prepareClient) reset(qps float32, burst int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	clear(c.requests)
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
// the node holds reads those, not every claim of the namespace.
func TestAPrepareDoesNotReadTheWholeNamespace(t *testing.T) {
	var api *prepareClient
	e := newEnv(t, "nvlink-2x4", seed, withPrepareClient(&api, 1000, 1000))
	for i := range 2 {
		e.prepareOK(e.reserveFor(e.standaloneClaim(class1x), fmt.Sprintf("pod-s%d", i)))
	}
	// Claims of other nodes' pods in the same namespace.
	const others = 500
	for i := range others {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("other-node-claim-%d", i)}}
		if _, err := e.client.ResourceV1().ResourceClaims("default").Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	read := 0 // claims the prepare client's answers held
	api.PrependReactor("*", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := e.client.Invokes(action, nil)
		mu.Lock()
		defer mu.Unlock()
		switch o := obj.(type) {
		case *resourceapi.ResourceClaimList:
			read += len(o.Items)
		case *resourceapi.ResourceClaim:
			read++
		}
		return true, obj, err
	})
	e.prepareOK(e.reserveFor(e.claim(class1x), "pod-new"))
	mu.Lock()
	defer mu.Unlock()
	if read > 10 {
		t.Errorf("a prepare beside 2 standalone claims of the node read %d claims of a namespace of %d; want the few it needs, not the namespace", read, others+3)
	}
}
