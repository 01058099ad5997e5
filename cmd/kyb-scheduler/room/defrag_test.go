package room

import (
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// The defragmentation tests run the real DynamicResources plugin and
// allocator over dgx-h100 nodes (one-GPU, two-GPU and four-GPU groups
// overlapping through their GPUs' counters) whose 1x seats are held by
// pods of the waiting pod's priority: preemption finds no victims, so
// defragmentation decides.

func neverPreempts(pod *v1.Pod) {
	never := v1.PreemptNever
	pod.Spec.PreemptionPolicy = &never
}

// runningSeats adds a 1x seat pod on each GPU of gpus, named
// <prefix>-gpu<N>. Its claim asks for any seat, as a controller's
// template does: its replacement may go anywhere.
func (f *fixture) runningSeats(prefix, node string, gpus []string, opts ...podOpt) {
	f.t.Helper()
	for _, gpu := range gpus {
		f.running(prefix+"-gpu"+gpu, node, class1x, 1, gpu, opts...)
		f.claims[len(f.claims)-1].Spec.Devices.Requests[0].Exactly.Selectors = nil
	}
}

// On node-a, moving the seat of GPU 0 frees the group of GPUs 0-3; every
// other group of either node needs two moves. The waiting 4x pod gets
// node-a, one pod is evicted (through the Eviction API), each side gets
// its event, and the devices stay the waiting pod's while the moved pod
// goes: a pod of its priority cannot have GPU 1.
func TestDefragmentationMovesTheFewestPods(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	f.defrag = Defragmentation{Mode: On}
	rs := ownedBy("ReplicaSet")
	f.runningSeats("a", "node-a", []string{"0", "4", "5"}, rs)
	f.runningSeats("b", "node-b", []string{"0", "1", "4", "5"}, rs)
	f.start()
	train := f.pending("train", class4x, 1)
	out := f.preempt(train)
	if !out.status.IsSuccess() || out.nominated != "node-a" || !slices.Equal(f.evicted, []string{"a-gpu0"}) {
		t.Fatalf("nominated %q evicting %v (%v), want node-a evicting [a-gpu0]", out.nominated, f.evicted, out.status)
	}
	moved := f.events.with(ReasonDefragmented)
	if len(moved) != 1 || moved[0].regarding != "a-gpu0" || moved[0].related != "train" || !strings.Contains(moved[0].note, "for pod default/train") {
		t.Errorf("events %s: %+v, want one on a-gpu0 naming default/train", ReasonDefragmented, moved)
	}
	waiting := f.events.with(ReasonDefragmenting)
	if len(waiting) != 1 || waiting[0].regarding != "train" || !strings.Contains(waiting[0].note, "default/a-gpu0 off node node-a") {
		t.Errorf("events %s: %+v, want one on train naming default/a-gpu0", ReasonDefragmenting, waiting)
	}

	f.release("a-gpu0")
	seat := f.pendingOn("seat-gpu1", class1x, "1", neverPreempts)
	if fits, _, _ := f.schedule(seat); len(fits) > 0 {
		t.Errorf("a pod of the waiting pod's priority fits %v on GPU 1, kept for it", fits)
	}
	fits, _, state := f.schedule(train)
	if !slices.Equal(fits, []string{"node-a"}) {
		t.Fatalf("train fits %v once the moved pod is gone, want node-a", fits)
	}
	if got := f.reserve(state, train, "node-a"); got != "g0123-4x" {
		t.Errorf("train takes %s, want g0123-4x", got)
	}
}

// Only a pod that a controller recreates and that did not opt out moves:
// where the pod of GPU 0 may not, those of GPUs 4 and 5 do.
func TestDefragmentationMovesOnlyMovablePods(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []podOpt
		// job, where set, is the Job "owner".
		job  *batchv1.JobSpec
		want []string
	}{
		{name: "ReplicaSet", opts: []podOpt{ownedBy("ReplicaSet")}, want: []string{"a-gpu0"}},
		{name: "StatefulSet", opts: []podOpt{ownedBy("StatefulSet")}, want: []string{"a-gpu0"}},
		{name: "Job", opts: []podOpt{ownedBy("Job")}, job: &batchv1.JobSpec{}, want: []string{"a-gpu0"}},
		{name: "Job below its backoffLimit", opts: []podOpt{ownedBy("Job")}, job: &batchv1.JobSpec{BackoffLimit: ptr.To[int32](1)}, want: []string{"a-gpu0"}},
		{name: "Job that ignores disruptions", opts: []podOpt{ownedBy("Job")}, job: &batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}}},
				{Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue}}},
			}},
		}, want: []string{"a-gpu0"}},
		{name: "Job that fails on disruptions", opts: []podOpt{ownedBy("Job")}, job: &batchv1.JobSpec{
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{Action: batchv1.PodFailurePolicyActionFailJob, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: v1.DisruptionTarget, Status: v1.ConditionTrue}}},
			}},
		}, want: []string{"a-gpu4", "a-gpu5"}},
		{name: "Job not known", opts: []podOpt{ownedBy("Job")}, want: []string{"a-gpu4", "a-gpu5"}},
		{name: "ReplicationController", opts: []podOpt{ownedBy("ReplicationController")}, want: []string{"a-gpu0"}},
		{name: "movable: true", opts: []podOpt{ownedBy("ReplicaSet"), annotated(MovableAnnotation, "true")}, want: []string{"a-gpu0"}},
		{name: "bare pod", want: []string{"a-gpu4", "a-gpu5"}},
		{name: "DaemonSet", opts: []podOpt{ownedBy("DaemonSet")}, want: []string{"a-gpu4", "a-gpu5"}},
		{name: "movable: false", opts: []podOpt{ownedBy("ReplicaSet"), annotated(MovableAnnotation, "false")}, want: []string{"a-gpu4", "a-gpu5"}},
		{name: "movable: no", opts: []podOpt{ownedBy("ReplicaSet"), annotated(MovableAnnotation, "no")}, want: []string{"a-gpu4", "a-gpu5"}},
		{name: "pod group member", opts: []podOpt{ownedBy("ReplicaSet"), inGroup("batch")}, want: []string{"a-gpu4", "a-gpu5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, threeProfiles, "node-a", "node-b")
			f.defrag = Defragmentation{Mode: On}
			if tc.job != nil {
				job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "default", UID: "uid-owner"}, Spec: *tc.job}
				if _, err := f.client.BatchV1().Jobs("default").Create(f.ctx, job, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			rs := ownedBy("ReplicaSet")
			f.runningSeats("a", "node-a", []string{"0"}, tc.opts...)
			f.runningSeats("a", "node-a", []string{"4", "5"}, rs)
			f.runningSeats("b", "node-b", []string{"0", "1", "2", "4", "5", "6"}, rs)
			f.start()
			out := f.preempt(f.pending("train", class4x, 1))
			if out.nominated != "node-a" || !slices.Equal(f.evicted, tc.want) {
				t.Errorf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, f.evicted, out.status, tc.want)
			}
		})
	}
}

// A pod whose claim another pod shares does not move: the claim stays
// allocated where it is, and would hold its replacement there. The two
// pods sharing GPU 0 stay, and the three of GPUs 4-6 move instead.
func TestDefragmentationLeavesSharedClaims(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	f.defrag = Defragmentation{Mode: On}
	rs := ownedBy("ReplicaSet")
	f.sharing("shared", "node-a", class1x, "0", newPod("a-one", rs), newPod("a-two", rs))
	// Any seat, as a controller's claim would ask: the claim, not its
	// selector, ties the pods to GPU 0.
	f.claims[len(f.claims)-1].Spec.Devices.Requests[0].Exactly.Selectors = nil
	f.runningSeats("a", "node-a", []string{"4", "5", "6"}, rs)
	f.runningSeats("b-bare", "node-b", []string{"0", "1", "4", "5"})
	f.start()
	out := f.preempt(f.pending("train", class4x, 1))
	if want := []string{"a-gpu4", "a-gpu5", "a-gpu6"}; out.nominated != "node-a" || !slices.Equal(f.evicted, want) {
		t.Errorf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, f.evicted, out.status, want)
	}
}

// Pods of our extended resources move and are moved for as claims' pods
// are: the ReplicaSet's pod asking kyb.ai/gpu-1x-seat on GPU 0 of node-a
// (GPUs 4-7 held) goes, the claim of its replacement made anew fitting on
// node-b, and a 4x pod asking kyb.ai/gpu-4x-seat gets node-a.
func TestDefragmentationOfExtendedResources(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	f.defrag = Defragmentation{Mode: On}
	rs := ownedBy("ReplicaSet")
	f.runningExtended("a-ext-gpu0", "node-a", "kyb.ai/gpu-1x-seat", 1, "0", rs)
	f.runningSeats("a", "node-a", []string{"4", "5", "6", "7"}, rs)
	f.runningSeats("b", "node-b", []string{"0", "1", "4", "5"}, rs)
	f.start()
	out := f.preempt(f.submit(extendedPod("train", "kyb.ai/gpu-4x-seat", 1)))
	if want := []string{"a-ext-gpu0"}; out.nominated != "node-a" || !slices.Equal(f.evicted, want) {
		t.Fatalf("nominated %q evicting %v (%v), want node-a evicting %v", out.nominated, f.evicted, out.status, want)
	}
	if moved := f.events.with(ReasonDefragmented); len(moved) != 1 || !strings.Contains(moved[0].note, "fits on node node-b") {
		t.Errorf("events %s: %+v, want one saying the replacement fits on node-b", ReasonDefragmented, moved)
	}
}

// A pod of a higher priority than the waiting pod never moves for it; of
// the same or a lower one it may (preemption, which runs first, takes
// only lower ones, and here finds no room with them).
func TestDefragmentationRespectsPriorities(t *testing.T) {
	for _, tc := range []struct {
		name     string
		gpu0     int32
		others   int32
		want     []string
		nominate string
	}{
		{name: "higher on GPU 0", gpu0: 1000, others: 100, want: []string{"a-gpu4", "a-gpu5"}, nominate: "node-a"},
		{name: "all higher", gpu0: 1000, others: 1000},
		{name: "all the same", gpu0: 100, others: 100, want: []string{"a-gpu0"}, nominate: "node-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, threeProfiles, "node-a")
			f.defrag = Defragmentation{Mode: On}
			rs := ownedBy("ReplicaSet")
			f.runningSeats("a", "node-a", []string{"0"}, rs, priority(tc.gpu0))
			f.runningSeats("a", "node-a", []string{"4", "5"}, rs, priority(tc.others))
			f.start()
			out := f.preempt(f.pending("train", class4x, 1, priority(100)))
			if out.nominated != tc.nominate || !slices.Equal(f.evicted, tc.want) {
				t.Errorf("nominated %q evicting %v (%v), want %q evicting %v", out.nominated, f.evicted, out.status, tc.nominate, tc.want)
			}
		})
	}
}

// A move that a PodDisruptionBudget does not allow is never planned,
// even where it is the only one.
func TestDefragmentationWithinDisruptionBudgets(t *testing.T) {
	rs := ownedBy("ReplicaSet")
	for _, tc := range []struct {
		name    string
		allowed int32
		others  []podOpt
		want    []string
	}{
		{name: "the guarded pod may not go", allowed: 0, others: []podOpt{rs}, want: []string{"a-gpu4", "a-gpu5"}},
		{name: "the guarded pod may go", allowed: 1, others: []podOpt{rs}, want: []string{"a-gpu0"}},
		{name: "the only movable pod may not go", allowed: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, threeProfiles, "node-a")
			f.defrag = Defragmentation{Mode: On}
			f.runningSeats("a", "node-a", []string{"0"}, rs, labels("app", "guarded"))
			f.runningSeats("a", "node-a", []string{"4", "5"}, tc.others...)
			f.pdb("guarded", tc.allowed, "app", "guarded")
			f.start()
			out := f.preempt(f.pending("train", class4x, 1))
			nominated := "node-a"
			if tc.want == nil {
				nominated = ""
			}
			if out.nominated != nominated || !slices.Equal(f.evicted, tc.want) {
				t.Errorf("nominated %q evicting %v (%v), want %q evicting %v", out.nominated, f.evicted, out.status, nominated, tc.want)
			}
		})
	}
}

// Every moved pod must fit elsewhere, the other moved pods counted: the
// group of GPUs 0-3 needs the seats of GPUs 0 and 1 moved, and the only
// free seats outside it are on node-b. With one there, each pod alone
// fits, both together do not: nothing is evicted. With two, both move.
func TestDefragmentationNeverEvictsAPodWithNowhereToGo(t *testing.T) {
	for _, tc := range []struct {
		name  string
		freeB int
		want  []string
	}{
		{name: "one free seat for two pods", freeB: 1},
		{name: "two free seats for two pods", freeB: 2, want: []string{"a-gpu0", "a-gpu1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, threeProfiles, "node-a", "node-b")
			f.defrag = Defragmentation{Mode: On}
			f.runningSeats("a", "node-a", []string{"0", "1"}, ownedBy("ReplicaSet"))
			f.runningSeats("a-bare", "node-a", []string{"4", "5", "6", "7"})
			f.runningSeats("b-bare", "node-b", []string{"0", "1", "2", "3", "4", "5", "6", "7"}[:8-tc.freeB])
			f.start()
			out := f.preempt(f.pending("train", class4x, 1))
			if !slices.Equal(f.evicted, tc.want) {
				t.Fatalf("evicted %v (%v), want %v", f.evicted, out.status, tc.want)
			}
			if tc.want == nil {
				if out.status.Code() != fwk.Unschedulable || out.nominated != "" || !strings.Contains(out.status.Message(), "defragmentation: no movable pods") {
					t.Errorf("status %v nominating %q, want Unschedulable saying defragmentation found nothing", out.status, out.nominated)
				}
				if ev := f.events.with(ReasonDefragmented); len(ev) > 0 {
					t.Errorf("events %+v for pods that were not moved", ev)
				}
			}
		})
	}
}

// A dry run says what it would move, in events on both sides and the
// pod's status, and evicts nothing; off, nothing is said either.
func TestDefragmentationDryRunEvictsNothing(t *testing.T) {
	for _, mode := range []Mode{DryRun, Off} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFixture(t, threeProfiles, "node-a", "node-b")
			f.defrag = Defragmentation{Mode: mode}
			rs := ownedBy("ReplicaSet")
			f.runningSeats("a", "node-a", []string{"0", "4", "5"}, rs)
			f.runningSeats("b", "node-b", []string{"0", "1", "4", "5"}, rs)
			f.start()
			out := f.preempt(f.pending("train", class4x, 1))
			if len(f.evicted) > 0 || len(out.victims) > 0 || out.nominated != "" || out.status.Code() != fwk.Unschedulable {
				t.Fatalf("evicted %v, nominated %q (%v), want nothing evicted", f.evicted, out.nominated, out.status)
			}
			dry := f.events.with(ReasonDefragmentationDryRun)
			said := strings.Contains(out.status.Message(), "defragmentation (dry run): would move default/a-gpu0 off node node-a")
			if mode == Off {
				if len(dry) > 0 || strings.Contains(out.status.Message(), "defragmentation") {
					t.Errorf("off: events %+v, status %v", dry, out.status)
				}
				return
			}
			if !said {
				t.Errorf("status %v does not say what would move", out.status)
			}
			var regarding []string
			for _, e := range dry {
				regarding = append(regarding, e.regarding)
			}
			slices.Sort(regarding)
			if !slices.Equal(regarding, []string{"a-gpu0", "train"}) {
				t.Errorf("dry-run events on %v, want on a-gpu0 and train", regarding)
			}
		})
	}
}

// Consolidation frees a group of the largest size on a node that has
// none free, within its budget, and moves no pod onto a node that has a
// free group (where it could break it).
func TestConsolidation(t *testing.T) {
	rs := ownedBy("ReplicaSet")
	for _, tc := range []struct {
		name    string
		budget  int
		setup   func(f *fixture)
		evicted int
	}{
		{name: "one move frees a group", budget: 1, evicted: 1, setup: func(f *fixture) {
			f.runningSeats("a", "node-a", []string{"0", "4"}, rs)
			f.runningSeats("b", "node-b", []string{"0", "1", "2", "4"}, rs)
		}},
		{name: "two moves, a budget of one", budget: 1, evicted: 0, setup: func(f *fixture) {
			f.runningSeats("a", "node-a", []string{"0", "1", "4", "5"}, rs)
			f.runningSeats("b", "node-b", []string{"0", "1", "4", "5"}, rs)
		}},
		{name: "two moves, a budget of two", budget: 2, evicted: 2, setup: func(f *fixture) {
			f.runningSeats("a", "node-a", []string{"0", "1", "4", "5"}, rs)
			f.runningSeats("b", "node-b", []string{"0", "1", "4", "5"}, rs)
		}},
		{name: "only a node with a free group to move to", budget: 2, evicted: 0, setup: func(f *fixture) {
			f.runningSeats("a", "node-a", []string{"0"}, rs)
			f.runningSeats("a-bare", "node-a", []string{"4", "5", "6", "7"})
		}},
		{name: "tainted GPU nodes", budget: 1, evicted: 1, setup: func(f *fixture) {
			for _, n := range f.nodes {
				n.Spec.Taints = []v1.Taint{{Key: "gpu", Value: "true", Effect: v1.TaintEffectNoSchedule}}
			}
			tolerates := func(pod *v1.Pod) {
				pod.Spec.Tolerations = []v1.Toleration{{Key: "gpu", Operator: v1.TolerationOpEqual, Value: "true", Effect: v1.TaintEffectNoSchedule}}
			}
			f.runningSeats("a", "node-a", []string{"0", "4"}, rs, tolerates)
			f.runningSeats("b", "node-b", []string{"0", "1", "2", "4"}, rs, tolerates)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, threeProfiles, "node-a", "node-b")
			f.defrag = Defragmentation{Mode: On, Period: time.Minute, EvictionsPerCycle: tc.budget}
			tc.setup(f)
			f.start()
			n, err := f.plugin.consolidate(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.evicted || len(f.evicted) != tc.evicted {
				t.Errorf("consolidation evicted %d (%v), want %d", n, f.evicted, tc.evicted)
			}
			for _, name := range f.evicted {
				if ev := f.events.with(ReasonDefragmented); !slices.ContainsFunc(ev, func(e event) bool { return e.regarding == name }) {
					t.Errorf("no %s event on %s: %+v", ReasonDefragmented, name, ev)
				}
			}
		})
	}
}

// A consolidation is due once per period, the first one a period after
// the first cycle.
func TestConsolidationIsDueOncePerPeriod(t *testing.T) {
	clock := testingclock.NewFakePassiveClock(time.Now())
	c := &consolidation{period: time.Minute, clock: clock}
	t0 := clock.Now()
	for _, step := range []struct {
		at  time.Duration
		due bool
	}{{0, false}, {30 * time.Second, false}, {61 * time.Second, true}, {62 * time.Second, false}, {2 * time.Minute, false}, {2*time.Minute + 2*time.Second, true}} {
		clock.SetTime(t0.Add(step.at))
		if got := c.due(); got != step.due {
			t.Errorf("due at +%v: %t, want %t", step.at, got, step.due)
		}
	}
}

// A scheduling cycle consolidates where one is due: not in the first
// cycle, in the first a period later, not again in the same period. In
// a dry run it says what it would move, in events on those pods, and
// evicts nothing; off, a period consolidates nothing.
func TestConsolidationRunsInTheCycleOncePerPeriod(t *testing.T) {
	for _, tc := range []struct {
		mode    Mode
		evicted []string
		dryRun  []string
	}{
		{mode: On, evicted: []string{"a-gpu0"}},
		{mode: DryRun, dryRun: []string{"a-gpu0"}},
		{mode: Off},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			f := newFixture(t, threeProfiles, "node-a", "node-b")
			f.defrag = Defragmentation{Mode: tc.mode, Period: time.Minute, EvictionsPerCycle: 1}
			rs := ownedBy("ReplicaSet")
			f.runningSeats("a", "node-a", []string{"0", "4"}, rs)
			f.runningSeats("b", "node-b", []string{"0", "1", "2", "4"}, rs)
			f.start()
			clock := testingclock.NewFakePassiveClock(time.Now())
			if c := f.plugin.consolidation; c != nil {
				c.clock = clock
			} else if tc.mode != Off {
				t.Fatalf("mode %s with a period: no consolidation", tc.mode)
			}
			seat := f.pending("seat", class1x, 1)
			t0 := clock.Now()
			for _, step := range []struct {
				after   time.Duration
				evicted []string
			}{{0, nil}, {30 * time.Second, nil}, {61 * time.Second, tc.evicted}, {62 * time.Second, tc.evicted}} {
				clock.SetTime(t0.Add(step.after))
				f.schedule(seat)
				if !slices.Equal(f.evicted, step.evicted) {
					t.Errorf("after a cycle at +%v: evicted %v, want %v", step.after, f.evicted, step.evicted)
				}
			}
			var dry []string
			for _, e := range f.events.with(ReasonDefragmentationDryRun) {
				dry = append(dry, e.regarding)
				if !strings.Contains(e.note, "consolidation") {
					t.Errorf("dry-run event on %s does not say it is a consolidation: %q", e.regarding, e.note)
				}
			}
			if !slices.Equal(dry, tc.dryRun) {
				t.Errorf("dry-run events on %v, want on %v", dry, tc.dryRun)
			}
		})
	}
}
