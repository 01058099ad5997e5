package room

import (
	"fmt"
	"slices"
	"testing"
	"time"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// On a node whose 1x seats of GPUs 0, 1, 2, 4 and 5 are held by
// low-priority pods, a 4x request evicts the pods of GPUs 4 and 5 (two),
// not those of 0, 1 and 2 (three), though the published order tries the
// group of GPUs 0-3 first. A second node needs three victims whichever
// group: the preemption nominates the first.
func TestFewestVictims(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	for _, gpu := range []string{"0", "1", "2", "4", "5"} {
		f.running("a-gpu"+gpu, "node-a", class1x, 1, gpu)
	}
	for _, gpu := range []string{"0", "1", "2", "4", "5", "6"} {
		f.running("b-gpu"+gpu, "node-b", class1x, 1, gpu)
	}
	f.start()
	out := f.preempt(f.pending("train", class4x, 1, priority(100)))
	if !out.status.IsSuccess() {
		t.Fatalf("preemption failed: %v", out.status)
	}
	if out.nominated != "node-a" || !slices.Equal(out.victims, []string{"a-gpu4", "a-gpu5"}) {
		t.Errorf("nominated %q evicting %v, want node-a evicting [a-gpu4 a-gpu5]", out.nominated, out.victims)
	}
}

// DefaultPreemption's search, even with the victims' claims released,
// removes every candidate and puts them back the most important first
// while the pod fits: with the pods of GPUs 4 and 5 the oldest (the most
// important among equal priorities), it puts those back first and
// evicts the three of GPUs 0-2. KybPreemption evicts two whatever the
// order.
func TestDefaultPreemptionsSearchDependsOnOrder(t *testing.T) {
	now := time.Now()
	for _, stock := range []bool{true, false} {
		f := newFixture(t, threeProfiles, "node-a")
		f.stock, f.stockReleases = stock, true
		for _, gpu := range []string{"0", "1", "2"} {
			f.running("gpu"+gpu, "node-a", class1x, 1, gpu, started(now.Add(-time.Minute)))
		}
		for _, gpu := range []string{"4", "5"} {
			f.running("gpu"+gpu, "node-a", class1x, 1, gpu, started(now.Add(-time.Hour)))
		}
		f.start()
		out := f.preempt(f.pending("train", class4x, 1, priority(100)))
		want := []string{"gpu4", "gpu5"}
		if stock {
			want = []string{"gpu0", "gpu1", "gpu2"}
		}
		if !slices.Equal(out.victims, want) {
			t.Errorf("stock %t: evicted %v (%v), want %v", stock, out.victims, out.status, want)
		}
	}
}

// While a preemption's victims terminate, the devices it found for the
// pod stay the pod's: a pod of a lower or the same priority that asks for
// one of them does not fit the node, and one that fits elsewhere on the
// node gets another device, though the allocator without the nominated
// pod (the framework's second pass) takes the first free one; a pod of a
// higher priority may take them.
func TestNominatedPodKeepsItsDevices(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a")
	f.running("low-gpu0", "node-a", class1x, 1, "0")
	f.running("low-gpu1", "node-a", class1x, 1, "1")
	for _, gpu := range []string{"4", "5", "6"} {
		f.running("high-gpu"+gpu, "node-a", class1x, 1, gpu, priority(1000))
	}
	f.start()
	train := f.pending("train", class4x, 1, priority(100))
	out := f.preempt(train)
	if out.nominated != "node-a" || !slices.Equal(out.victims, []string{"low-gpu0", "low-gpu1"}) {
		t.Fatalf("nominated %q evicting %v (%v), want node-a evicting [low-gpu0 low-gpu1]", out.nominated, out.victims, out.status)
	}
	// The victims are gone; the resource-claim controller releases their
	// claims: GPUs 0-3 and 7 are free.
	f.release(out.victims...)

	for _, tc := range []struct {
		name     string
		priority int32
		gpus     string
		fits     bool
		device   string
	}{
		{name: "lower priority, GPU 0", priority: 0, gpus: "0", fits: false},
		{name: "same priority, GPU 2", priority: 100, gpus: "2", fits: false},
		{name: "lower priority, any GPU", priority: 0, fits: true, device: "g7-1x"},
		{name: "higher priority, GPU 0", priority: 200, gpus: "0", fits: true, device: "g0-1x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := f.pendingOn(fmt.Sprintf("seat-%d-%s", tc.priority, tc.gpus), class1x, tc.gpus, priority(tc.priority))
			fits, _, state := f.schedule(pod)
			if got := len(fits) > 0; got != tc.fits {
				t.Fatalf("fits %v, want fits: %t", fits, tc.fits)
			}
			if !tc.fits {
				return
			}
			if got := f.reserve(state, pod, "node-a"); got != tc.device {
				t.Errorf("Reserve takes %s, want %s", got, tc.device)
			}
		})
	}

	// The pod itself fits there, on what was kept for it.
	fits, _, state := f.schedule(train)
	if !slices.Equal(fits, []string{"node-a"}) {
		t.Fatalf("%s fits %v once its victims are gone, want node-a", train.Name, fits)
	}
	if got := f.reserve(state, train, "node-a"); got != "g0123-4x" {
		t.Errorf("%s takes %s, want g0123-4x", train.Name, got)
	}
}

// A claim that a staying pod also uses is not released by evicting the
// pods of lower priority that use it: a group it blocks stays blocked. A
// claim two victims share is released only with both.
func TestSharedClaims(t *testing.T) {
	t.Run("shared with a pod that stays", func(t *testing.T) {
		f := newFixture(t, threeProfiles, "node-a")
		for _, gpu := range []string{"0", "1", "2", "5"} {
			f.running("low-gpu"+gpu, "node-a", class1x, 1, gpu)
		}
		f.sharing("gpu4", "node-a", class1x, "4", newPod("low-share"), newPod("high-share", priority(1000)))
		f.start()
		out := f.preempt(f.pending("train", class4x, 1, priority(100)))
		if want := []string{"low-gpu0", "low-gpu1", "low-gpu2"}; out.nominated != "node-a" || !slices.Equal(out.victims, want) {
			t.Errorf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, out.victims, out.status, want)
		}
	})
	t.Run("shared by two victims", func(t *testing.T) {
		f := newFixture(t, threeProfiles, "node-a")
		for _, gpu := range []string{"0", "1", "2"} {
			f.running("gpu"+gpu, "node-a", class1x, 1, gpu, priority(10))
		}
		f.running("low-gpu5", "node-a", class1x, 1, "5")
		f.sharing("gpu4", "node-a", class1x, "4", newPod("share-a"), newPod("share-b"))
		f.start()
		out := f.preempt(f.pending("train", class4x, 1, priority(100)))
		// Three pods either way: those of the lowest priorities go.
		if want := []string{"low-gpu5", "share-a", "share-b"}; out.nominated != "node-a" || !slices.Equal(out.victims, want) {
			t.Errorf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, out.victims, out.status, want)
		}
	})
}

// PodDisruptionBudgets count as kube-scheduler counts them: fewer
// violated before fewer victims.
func TestDisruptionBudgets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		allowed int32
		want    []string
	}{
		{name: "the guarded pod may not go", allowed: 0, want: []string{"low-gpu4", "low-gpu5"}},
		{name: "the guarded pod may go", allowed: 1, want: []string{"guarded"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, threeProfiles, "node-a")
			f.running("guarded", "node-a", class1x, 1, "0", labels("app", "guarded"))
			f.running("low-gpu4", "node-a", class1x, 1, "4")
			f.running("low-gpu5", "node-a", class1x, 1, "5")
			f.pdb("guarded", tc.allowed, "app", "guarded")
			f.start()
			out := f.preempt(f.pending("train", class4x, 1, priority(100)))
			if out.nominated != "node-a" || !slices.Equal(out.victims, tc.want) {
				t.Errorf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, out.victims, out.status, tc.want)
			}
		})
	}
}

// Shares of a group: a four-GPU group is free only once every share of
// every group on its GPUs is gone (its counters), and a request for two
// seats of a group needs one victim where every group has one seat
// taken (its capacity).
func TestSharedGroups(t *testing.T) {
	t.Run("counters", func(t *testing.T) {
		f := newFixture(t, sharedProfiles, "node-a")
		f.running("gpu0-a", "node-a", class1x, 1, "0")
		f.running("gpu0-b", "node-a", class1x, 1, "0")
		f.running("gpu4-a", "node-a", class1x, 1, "4")
		f.running("gpu5-a", "node-a", class1x, 1, "5")
		f.running("gpu5-b", "node-a", class1x, 1, "5")
		f.start()
		out := f.preempt(f.pending("train", class4x, 1, priority(100)))
		if want := []string{"gpu0-a", "gpu0-b"}; out.nominated != "node-a" || !slices.Equal(out.victims, want) {
			t.Errorf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, out.victims, out.status, want)
		}
	})
	t.Run("capacity", func(t *testing.T) {
		f := newFixture(t, sharedProfiles, "node-a")
		for gpu := range 8 {
			f.running(fmt.Sprintf("gpu%d", gpu), "node-a", class1x, 1, fmt.Sprint(gpu), priority(int32(10-gpu)))
		}
		f.start()
		pod := newPod("two-seats", priority(100))
		claim := schedulertest.Claim("two-seats-gpu", class1x, 1, schedulertest.WithCapacity("seats", "2"))
		f.create(claim)
		f.waitFor("claim", func() bool { _, err := f.dra.ResourceClaims().Get(claim.Namespace, claim.Name); return err == nil })
		withClaim(pod, claim.Name)
		out := f.preempt(f.submit(pod))
		// One victim, of the lowest priority.
		if want := []string{"gpu7"}; out.nominated != "node-a" || !slices.Equal(out.victims, want) {
			t.Errorf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, out.victims, out.status, want)
		}
	})
}

// Pods that ask for our extended resources (kyb.ai/gpu-1x-seat in their
// limits, served through the claim the scheduler makes) are victims as
// pods with claims are, and preempt as they do.
func TestExtendedResources(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a")
	for _, gpu := range []string{"0", "1", "2"} {
		f.running("claim-gpu"+gpu, "node-a", class1x, 1, gpu)
	}
	f.runningExtended("ext-gpu4", "node-a", "kyb.ai/gpu-1x-seat", 1, "4")
	f.runningExtended("ext-gpu5", "node-a", "kyb.ai/gpu-1x-seat", 1, "5")
	f.start()
	train := f.submit(extendedPod("train", "kyb.ai/gpu-4x-seat", 1, priority(100)))
	out := f.preempt(train)
	if want := []string{"ext-gpu4", "ext-gpu5"}; out.nominated != "node-a" || !slices.Equal(out.victims, want) {
		t.Fatalf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, out.victims, out.status, want)
	}
	// What it found is kept for it: a seat on GPU 6 does not fit.
	f.release(out.victims...)
	fits, _, _ := f.schedule(f.pendingOn("seat-gpu6", class1x, "6"))
	if len(fits) != 0 {
		t.Errorf("a seat on GPU 6 fits %v while the 4x pod's victims terminate", fits)
	}
}

// A gang is evicted whole or not at all: its pod on a node stands for
// every pod of the group, on whatever node. Here the gang's pod on
// node-b blocks a four-GPU group there; evicting the gang (two pods, one
// on node-a) is cheaper than any set on node-a (three pods).
func TestGangEvictedWhole(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.GenericWorkload, true)
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	f.gang("batch", 2, 0)
	f.running("batch-0", "node-a", class1x, 1, "4", inGroup("batch"))
	f.running("batch-1", "node-b", class1x, 1, "0", inGroup("batch"))
	f.running("low-gpu5", "node-a", class1x, 1, "5")
	for _, gpu := range []string{"0", "1", "2"} {
		f.running("mid-gpu"+gpu, "node-a", class1x, 1, gpu, priority(10))
	}
	for _, gpu := range []string{"4", "5"} {
		f.running("high-gpu"+gpu, "node-b", class1x, 1, gpu, priority(1000))
	}
	f.start()
	out := f.preempt(f.pending("train", class4x, 1, priority(100)))
	if want := []string{"batch-0", "batch-1"}; out.nominated != "node-b" || !slices.Equal(out.victims, want) {
		t.Errorf("nominated %q evicting %v (%v), want node-b evicting %v", out.nominated, out.victims, out.status, want)
	}
}

// With asynchronous preemption the preemptor is gated while its victims
// are evicted, and a gated pod is woken only by events its gating plugin
// registered: the release of a victim's claim must be one, or a release
// seen before the last eviction leaves the preemptor waiting for the
// scheduler's periodic flush.
func TestGatedPreemptorWakesOnClaimRelease(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a")
	f.start()
	fts := f.fts
	fts.EnableAsyncPreemption = true
	pl, err := New(f.ctx, nil, f.fw, fts, Defragmentation{})
	if err != nil {
		t.Fatal(err)
	}
	events, err := pl.EventsToRegister(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.Event.Resource == fwk.ResourceClaim && e.Event.ActionType&fwk.Update != 0 {
			return
		}
	}
	t.Errorf("events %v: no ResourceClaim update", events)
}

// Between its victims' going and the release of their claims, a pod
// nominated to a node does not preempt again: tried in that gap, it would
// find no room there yet, no victim terminating, and evict a second set
// of pods on the other node.
func TestNoSecondPreemptionWhileClaimsAreReleased(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	for _, node := range []string{"node-a", "node-b"} {
		for _, gpu := range []string{"0", "1", "2", "4", "5"} {
			f.running(node+"-gpu"+gpu, node, class1x, 1, gpu)
		}
	}
	f.start()
	train := f.pending("train", class4x, 1, priority(100))
	first := f.preempt(train)
	if len(first.victims) != 2 {
		t.Fatalf("the first preemption evicted %v (%v), want two pods", first.victims, first.status)
	}
	lister := f.fw.SharedInformerFactory().Core().V1().Pods().Lister()
	f.waitFor("the victims gone from the scheduler's cache", func() bool {
		for _, v := range first.victims {
			if _, err := lister.Pods("default").Get(v); err == nil {
				return false
			}
		}
		return true
	})
	// The scheduler's snapshot has them gone; their claims are still
	// allocated: the resource-claim controller has not released them yet.
	f.forget(first.victims...)
	second := f.preempt(train)
	if len(second.victims) != 0 || second.status.IsSuccess() {
		t.Errorf("tried again before the victims' claims are released, the pod evicted %v (%v), want none", second.victims, second.status)
	}
	// Released between the cycle's PreFilter, which saw them held, and
	// its PostFilter: the next cycle finds the room.
	f.beforePostFilter = func() { f.release(first.victims...) }
	third := f.preempt(train)
	if len(third.victims) != 0 || third.status.IsSuccess() {
		t.Errorf("with the claims released during the cycle, the pod evicted %v (%v), want none", third.victims, third.status)
	}
	f.beforePostFilter = nil
	if fits, _, _ := f.schedule(train); !slices.Equal(fits, []string{first.nominated}) {
		t.Errorf("once its victims' claims are released the pod fits %v, want %s", fits, first.nominated)
	}
}

// With asynchronous preemption, the preemptor is activated once its
// preemption ends: a victim's claim may be seen released while the
// preemptor is still gated, and nothing would wake it then.
func TestPreemptorActivatedWhenItsPreemptionEnds(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a")
	f.fts.EnableAsyncPreemption = true
	for _, gpu := range []string{"0", "1", "2", "4", "5"} {
		f.running("gpu"+gpu, "node-a", class1x, 1, gpu)
	}
	f.start()
	out := f.preempt(f.pending("train", class4x, 1, priority(100)))
	if out.nominated != "node-a" {
		t.Fatalf("nominated %q (%v), want node-a", out.nominated, out.status)
	}
	f.waitFor("the preemptor activated", func() bool { return slices.Contains(f.activator.activated(), "train") })
}
