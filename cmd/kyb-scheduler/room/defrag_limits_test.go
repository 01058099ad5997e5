package room

import (
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"
)

// Two pods waiting for a 4x group are defragmented for one after the
// other, as a Deployment of two such replicas is: the first moves
// a-gpu0, whose replacement its check found a seat for, and the
// replacement is not yet created when the second's cycle comes. The
// second must not plan a move into the seat the first counted on: one
// seat outside both freed groups (GPU 7 of node-c) is left for the two
// moved pods, and one of them would fit nowhere.
func TestDefragmentationCountsTheMovesOfEarlierDefragmentations(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b", "node-c")
	f.defrag = Defragmentation{Mode: On}
	rs := ownedBy("ReplicaSet")
	f.runningSeats("a", "node-a", []string{"0"}, rs)
	f.runningSeats("a-bare", "node-a", []string{"4", "5", "6", "7"})
	f.runningSeats("b", "node-b", []string{"0"}, rs)
	f.runningSeats("b-bare", "node-b", []string{"4", "5", "6", "7"})
	f.runningSeats("c-bare", "node-c", []string{"0", "1", "2", "3", "4", "5", "6"})
	f.start()

	first := f.preempt(f.pending("train-1", class4x, 1))
	if first.nominated != "node-a" || !slices.Equal(f.evicted, []string{"a-gpu0"}) {
		t.Fatalf("first: nominated %q evicting %v (%v), want node-a evicting [a-gpu0]", first.nominated, f.evicted, first.status)
	}
	// a-gpu0 is gone and its claim released; its controller has not made
	// its replacement yet.
	f.release("a-gpu0")
	f.forget("a-gpu0")

	second := f.preempt(f.pending("train-2", class4x, 1))
	var fitsOn []string
	for _, e := range f.events.with(ReasonDefragmented) {
		fitsOn = append(fitsOn, e.regarding+": "+e.note[strings.LastIndex(e.note, "fits"):])
	}
	if !slices.Equal(f.evicted, []string{"a-gpu0"}) {
		t.Errorf("second: nominated %q evicting %v (%v); want only a-gpu0 evicted in all: "+
			"one free seat outside the freed groups for the replacements of %v (%v)",
			second.nominated, f.evicted, second.status, f.evicted, fitsOn)
	}
}

// A Job whose backoffLimit is 0 and whose pods never restart does not
// make a new pod for an evicted one: the eviction counts as its pod's
// failure, and the Job fails. Its pod is not movable; those of GPUs 4
// and 5 move instead.
func TestDefragmentationLeavesAJobThatFailsOnEviction(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a")
	f.defrag = Defragmentation{Mode: On}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "once", Namespace: "default", UID: "uid-once"},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template:     v1.PodTemplateSpec{Spec: v1.PodSpec{RestartPolicy: v1.RestartPolicyNever, Containers: []v1.Container{{Name: "app"}}}},
		},
	}
	if _, err := f.client.BatchV1().Jobs("default").Create(f.ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ownedByJob := func(pod *v1.Pod) {
		pod.Spec.RestartPolicy = v1.RestartPolicyNever
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}
	}
	f.runningSeats("a", "node-a", []string{"0"}, ownedByJob)
	f.runningSeats("a", "node-a", []string{"4", "5"}, ownedBy("ReplicaSet"))
	f.start()
	out := f.preempt(f.pending("train", class4x, 1))
	if want := []string{"a-gpu4", "a-gpu5"}; !slices.Equal(f.evicted, want) {
		t.Errorf("nominated %q evicting %v (%v), want %v: a-gpu0's Job (backoffLimit 0, restartPolicy Never) fails on its eviction", out.nominated, f.evicted, out.status, want)
	}
}

// A cordoned node takes no new pod: a group consolidation frees there is
// of use to no one, and the pods it evicts (which an operator may have
// cordoned the node to let finish) lose their work for nothing.
func TestConsolidationLeavesCordonedNodes(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	f.defrag = Defragmentation{Mode: On, Period: time.Minute, EvictionsPerCycle: 1}
	cordoned := f.nodes[0]
	cordoned.Spec.Unschedulable = true
	cordoned.Spec.Taints = []v1.Taint{{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}}
	rs := ownedBy("ReplicaSet")
	f.runningSeats("a", "node-a", []string{"0", "4"}, rs)
	f.runningSeats("b-bare", "node-b", []string{"0", "1", "2", "4", "5", "6"})
	f.start()
	n, err := f.plugin.consolidate(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 || len(f.evicted) > 0 {
		t.Errorf("consolidation evicted %d (%v) to free a group on cordoned node-a, want none", n, f.evicted)
	}
}

// The API server may refuse an eviction the search allowed (a budget
// changed since the scheduler's informer saw it, or a pod two budgets
// select). Where the second of two moves is refused, the first pod is
// gone already, and its seat is kept for no one: its replacement may take
// it back, and the waiting pod's next cycle evicts it again, and again,
// each time for nothing.
func TestDefragmentationEvictsNoMoreAfterARefusedEviction(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	f.defrag = Defragmentation{Mode: On}
	rs := ownedBy("ReplicaSet")
	f.runningSeats("a", "node-a", []string{"0"}, rs)
	// Evictions go in the order of namespace and name: the refused one
	// last.
	f.runningSeats("z", "node-a", []string{"1"}, rs)
	f.runningSeats("a-bare", "node-a", []string{"4", "5", "6", "7"})
	f.runningSeats("b-bare", "node-b", []string{"0", "1", "2", "3", "4", "5"})
	f.client.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "eviction" || action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction).Name != "z-gpu1" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	})
	f.start()
	train := f.pending("train", class4x, 1)
	first := f.preempt(train)
	if !slices.Equal(f.evicted, []string{"a-gpu0"}) {
		t.Fatalf("first cycle: evicted %v (%v), want a-gpu0 evicted and z-gpu1 refused", f.evicted, first.status)
	}
	f.release("a-gpu0")
	f.forget("a-gpu0")

	// The ReplicaSet's new pod lands on the seat a-gpu0 left, which no one
	// keeps.
	back := newPod("a-new", rs)
	back.Spec.NodeName = "node-a"
	back.Status.Phase = v1.PodRunning
	var claim *resourceapi.ResourceClaim
	for _, c := range f.claims {
		if c.Name == "a-gpu0-gpu" {
			claim = c.DeepCopy()
		}
	}
	claim.Name, claim.UID, claim.ResourceVersion = "a-new-gpu", "uid-a-new-gpu", ""
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: back.Name, UID: back.UID}}
	f.create(claim)
	withClaim(back, claim.Name)
	f.submit(back)
	f.waitFor("claim "+claim.Name, func() bool { _, err := f.dra.ResourceClaims().Get(claim.Namespace, claim.Name); return err == nil })
	pi, err := framework.NewPodInfo(back)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.snapshot.AssumePod(pi); err != nil {
		t.Fatal(err)
	}

	second := f.preempt(train)
	if !slices.Equal(f.evicted, []string{"a-gpu0"}) {
		t.Errorf("second cycle (%v): evicted %v in all, want only a-gpu0: the waiting pod's defragmentation evicts the pod in the seat it freed again, "+
			"while the eviction that stopped it is refused again", second.status, f.evicted)
	}
}

// A pod a PodDisruptionBudget selects is evicted first: where the API
// server refuses it (its budget changed since the informer saw it),
// nothing has been evicted for nothing.
func TestDefragmentationEvictsBudgetedPodsFirst(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	f.defrag = Defragmentation{Mode: On}
	rs := ownedBy("ReplicaSet")
	f.runningSeats("a", "node-a", []string{"0"}, rs)
	f.runningSeats("z", "node-a", []string{"1"}, rs, labels("app", "z"))
	f.pdb("z", 1, "app", "z")
	f.runningSeats("a-bare", "node-a", []string{"4", "5", "6", "7"})
	f.runningSeats("b-bare", "node-b", []string{"0", "1", "2", "3", "4", "5"})
	var tried []string
	f.client.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		name := action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction).Name
		tried = append(tried, name)
		if name != "z-gpu1" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	})
	f.start()
	out := f.preempt(f.pending("train", class4x, 1))
	if len(f.evicted) > 0 || !slices.Equal(tried, []string{"z-gpu1"}) {
		t.Errorf("tried evicting %v, evicted %v (nominated %q, %v); want z-gpu1, which its budget selects, tried first and nothing evicted",
			tried, f.evicted, out.nominated, out.status)
	}
	if out.nominated != "" {
		t.Errorf("nominated to %q with nothing evicted", out.nominated)
	}
}
