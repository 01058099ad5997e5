package placement

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/parallelize"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

func threeNodes() []nodeSpec {
	return []nodeSpec{
		{"node-a", "dgx-h100", threeProfiles},
		{"node-b", "dgx-h100", threeProfiles},
		{"node-c", "dgx-h100", threeProfiles},
	}
}

// placeSeats schedules n one-GPU seat pods one after the other and
// returns their nodes; every other allocation is written to the API
// server, the others stay in flight, as in a burst.
func placeSeats(t *testing.T, f *fixture, n int, class string, annotate map[string]string) []string {
	t.Helper()
	var got []string
	for i := range n {
		pod, claim := f.seatPod(class, 1)
		pod.Annotations = annotate
		got = append(got, f.schedule(pod, claim, i%2 == 0))
	}
	return got
}

func TestPackFillsOneNodeBeforeTheNext(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack}, threeNodes()...)
	got := placeSeats(t, f, 10, class1x, nil)
	// The first pod finds three empty nodes and takes one of them
	// (node-b); the next seven fill it; the ninth finds two empty nodes.
	want := []string{"node-b", "node-b", "node-b", "node-b", "node-b", "node-b", "node-b", "node-b", "node-c", "node-c"}
	if !slices.Equal(got, want) {
		t.Errorf("pack placed consecutive 1x seats on\n%v\nwant\n%v", got, want)
	}
}

// Four seats per one-GPU group: pack joins the group in use on the node
// in use before it takes another GPU anywhere.
func TestPackFillsSharedGroupsFirst(t *testing.T) {
	const fourSeats = "profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}\n- {resource: kyb.ai/gpu-2x-seat}\n"
	f := newFixture(t, Args{}, nodeSpec{"node-a", "dgx-h100", fourSeats}, nodeSpec{"node-b", "dgx-h100", fourSeats})
	got := placeSeats(t, f, 6, class1x, nil)
	want := []string{"node-b", "node-b", "node-b", "node-b", "node-b", "node-b"}
	if !slices.Equal(got, want) {
		t.Errorf("pack placed consecutive seats on %v, want %v", got, want)
	}
}

func TestSpreadSpreadsOverNodes(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Spread}, threeNodes()...)
	got := placeSeats(t, f, 6, class1x, nil)
	// Each pod takes one of the emptiest nodes: never a node with more
	// seats taken than another.
	want := []string{"node-b", "node-a", "node-c", "node-b", "node-c", "node-a"}
	if !slices.Equal(got, want) {
		t.Errorf("spread placed consecutive 1x seats on %v, want %v", got, want)
	}
}

// Pack and topology both keep larger groups whole among the nodes in
// use: node-a holds 1x seats on GPUs 0 and 2, so its next seat (GPU 1)
// breaks no idle larger group; node-b, fuller (2x seats on GPUs 0-1 and
// 4-5), has its next seat (GPU 2) break the idle pair 2-3. Both choose
// node-a: taking the fullest node first would break the pair.
//
// They part where keeping larger groups whole would take an empty node:
// node-c has one GPU, so a seat there breaks nothing, and node-d holds a
// 2x seat on GPUs 0-1, so its next seat breaks the pair 2-3. Topology
// takes node-c, pack node-d, keeping node-c whole. (A node of eight GPUs
// that publishes one-GPU groups alone ranks, empty, as an honest empty
// node of eight: TestANodeWithoutLargerGroupsRanksNoBetterThanAnHonestOne.)
func TestTopologyKeepsLargerGroupsWhole(t *testing.T) {
	type seat struct{ node, class, gpus string }
	among := []nodeSpec{{"node-a", "dgx-h100", threeProfiles}, {"node-b", "dgx-h100", threeProfiles}}
	amongSeats := []seat{{"node-a", class1x, "0"}, {"node-a", class1x, "2"}, {"node-b", class2x, "0,1"}, {"node-b", class2x, "4,5"}}
	empty := []nodeSpec{{"node-c", "single-gpu", threeProfiles}, {"node-d", "dgx-h100", threeProfiles}}
	emptySeats := []seat{{"node-d", class2x, "0,1"}}
	for _, tc := range []struct {
		name   string
		nodes  []nodeSpec
		seats  []seat
		policy Policy
		want   string
	}{
		{"among nodes in use", among, amongSeats, Topology, "node-a"},
		{"among nodes in use", among, amongSeats, Pack, "node-a"},
		{"an empty node", empty, emptySeats, Topology, "node-c"},
		{"an empty node", empty, emptySeats, Pack, "node-d"},
	} {
		t.Run(tc.name+"/"+string(tc.policy), func(t *testing.T) {
			f := newFixture(t, Args{DefaultPolicy: tc.policy}, tc.nodes...)
			for _, s := range tc.seats {
				_, claim := f.seatPod(s.class, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+s.gpus+`"`))
				f.allocate(claim, s.node, true)
			}
			pod, claim := f.seatPod(class1x, 1)
			state := framework.NewCycleState()
			scores, st := f.scoresIn(state, pod, f.feasibleWith(f.cycleAllocator(state, pod), claim))
			if st != nil {
				t.Fatal(st)
			}
			if got := best(f.nodes, scores, 0); got != tc.want || scores[got] != 100 {
				t.Errorf("%s chose %s (scores %v), want %s at 100", tc.policy, got, scores, tc.want)
			}
		})
	}
}

// A pod asking for kyb.ai/gpu-1x-seat in its limits is scored through the
// DeviceClass that serves the resource, exactly as a pod with a claim.
func TestExtendedResourcePodScoredAsAClaim(t *testing.T) {
	f := newFixture(t, Args{}, threeNodes()...)
	_, claim := f.seatPod(class1x, 1)
	f.allocate(claim, "node-b", true)

	extended := f.extendedPod("kyb.ai/gpu-1x-seat", 1)
	got, st := f.scores(extended, f.nodes)
	if st != nil {
		t.Fatal(st)
	}
	pod, _ := f.seatPod(class1x, 1)
	want, st := f.scores(pod, f.nodes)
	if st != nil {
		t.Fatal(st)
	}
	if got["node-b"] != 100 || got["node-a"] != 0 || got["node-c"] != 0 {
		t.Errorf("extended-resource pod scored %v, want node-b 100, others 0", got)
	}
	for _, n := range f.nodes {
		if got[n] != want[n] {
			t.Errorf("on %s the extended-resource pod scored %d, the claim pod %d", n, got[n], want[n])
		}
	}
}

// The pod's annotation chooses the policy over the configuration's; a
// DeviceClass's entry over the default. node-a holds one seat.
func TestPolicyFromAnnotationClassAndDefault(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack, DeviceClassPolicies: map[string]Policy{class2x: Spread}}, threeNodes()...)
	_, claim := f.seatPod(class1x, 1)
	f.allocate(claim, "node-a", false)
	packed := map[string]int64{"node-a": 100, "node-b": 0, "node-c": 0}
	spread := map[string]int64{"node-a": 0, "node-b": 100, "node-c": 100}
	for _, tc := range []struct {
		name     string
		class    string
		annotate string
		want     map[string]int64
	}{
		{"default pack", class1x, "", packed},
		{"annotation spread", class1x, "spread", spread},
		{"class spread", class2x, "", spread},
		{"annotation over class", class2x, "pack", packed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, claim := f.seatPod(tc.class, 1)
			if tc.annotate != "" {
				pod.Annotations = map[string]string{PolicyAnnotation: tc.annotate}
			}
			scores, st := f.scores(pod, f.feasible(claim))
			if st != nil {
				t.Fatal(st)
			}
			if !maps.Equal(scores, tc.want) {
				t.Errorf("scores %v, want %v", scores, tc.want)
			}
		})
	}
}

func TestBadAnnotationIsAnErrorNamingIt(t *testing.T) {
	f := newFixture(t, Args{}, threeNodes()...)
	pod, claim := f.seatPod(class1x, 1)
	pod.Annotations = map[string]string{PolicyAnnotation: "binpack"}
	_, st := f.scores(pod, f.feasible(claim))
	if st.Code() != fwk.Error {
		t.Fatalf("PreScore returned %v, want an error", st)
	}
	for _, want := range []string{pod.Name, PolicyAnnotation, `"binpack"`, "pack", "topology", "spread"} {
		if !strings.Contains(st.Message(), want) {
			t.Errorf("error %q does not name %s", st.Message(), want)
		}
	}
}

func TestPodsWithoutDevicesSkipTheScore(t *testing.T) {
	f := newFixture(t, Args{}, threeNodes()...)
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app"}}}}
	if _, st := f.scores(pod, f.nodes); st.Code() != fwk.Skip {
		t.Errorf("PreScore of a pod without devices returned %v, want Skip", st)
	}
	if _, st := f.plugin.SignPod(f.ctx, pod); !st.IsSuccess() {
		t.Errorf("a pod without devices is not signable: %v", st)
	}
	seat, _ := f.seatPod(class1x, 1)
	if _, st := f.plugin.SignPod(f.ctx, seat); st.IsSuccess() {
		t.Error("a seat pod is signable: batching would reuse a score the placement changes")
	}
	if _, st := f.plugin.SignPod(f.ctx, f.extendedPod("kyb.ai/gpu-1x-seat", 1)); st.IsSuccess() {
		t.Error("an extended-resource seat pod is signable")
	}
}

// largestKey is the largest key any policy gives: topology's, of a node
// in use where a sized pod breaks nothing, joins a group in use and
// leaves no memory.
var largestKey = outcome{ours: true, predicted: true, gpus: 8, busy: 8, picks: 1, joined: 1, sized: 1}.key(Topology)

func TestNormalizeMapsKeysOntoTheScoreRange(t *testing.T) {
	if largestKey <= 0 || largestKey >= 1<<62 {
		t.Fatalf("the largest key is %d, want it below 2^62", largestKey)
	}
	for _, tc := range []struct {
		name      string
		keys, out []int64
	}{
		{"ordered", []int64{10, 30, 20}, []int64{0, 100, 50}},
		{"all equal: no preference", []int64{7, 7}, []int64{0, 0}},
		{"large keys", []int64{0, 998 * packSpan, 999 * packSpan}, []int64{0, 99, 100}},
		{"the largest keys", []int64{largestKey - 1, 0, largestKey, largestKey / 2}, []int64{99, 0, 100, 49}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			list := make(fwk.NodeScoreList, len(tc.keys))
			for i, k := range tc.keys {
				list[i] = fwk.NodeScore{Name: string(rune('a' + i)), Score: k}
			}
			normalize(list)
			for i, s := range list {
				if s.Score != tc.out[i] {
					t.Errorf("key %d normalized to %d, want %d", tc.keys[i], s.Score, tc.out[i])
				}
			}
		})
	}
}

// Allocations in flight (reserved, not yet written) count as the
// scheduler's claim tracker counts them: a burst of pods packs as one
// pod after the other does.
func TestInFlightAllocationsCount(t *testing.T) {
	f := newFixture(t, Args{}, threeNodes()...)
	_, claim := f.seatPod(class1x, 1)
	f.allocate(claim, "node-c", false)
	pod, _ := f.seatPod(class1x, 1)
	scores, st := f.scores(pod, f.nodes)
	if st != nil {
		t.Fatal(st)
	}
	if want := map[string]int64{"node-a": 0, "node-b": 0, "node-c": 100}; !maps.Equal(scores, want) {
		t.Errorf("with a seat in flight on node-c: scores %v, want %v", scores, want)
	}
}

// The score judges the nodes by the allocated state the DynamicResources
// plugin's PreFilter gathered for the cycle, which its Filter allocated
// against, not by a state gathered again: here the cycle's state holds
// four seats on node-b that the claim tracker has not seen, and pack
// follows the cycle.
func TestScoreReadsTheCyclesAllocatedState(t *testing.T) {
	nodes := []nodeSpec{{"node-a", "dgx-h100", threeProfiles}, {"node-b", "dgx-h100", threeProfiles}}
	other := newFixture(t, Args{}, nodes...)
	for range 4 {
		_, claim := other.seatPod(class1x, 1)
		other.allocate(claim, "node-b", false)
	}
	gathered, err := other.dra.ResourceClaims().GatherAllocatedState()
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, Args{DefaultPolicy: Pack}, nodes...)
	pod, _ := f.seatPod(class1x, 1)
	state := framework.NewCycleState()
	state.Write(dynamicresources.AllocatedStateKey, &dynamicresources.AllocatedStateData{State: gathered})
	scores, st := f.scoresIn(state, pod, []string{"node-a", "node-b"})
	if scores == nil {
		t.Fatalf("PreScore: %v", st)
	}
	if scores["node-b"] <= scores["node-a"] {
		t.Errorf("pack scored node-a %d and node-b %d; the cycle's state holds four seats on node-b, so node-b should lead", scores["node-a"], scores["node-b"])
	}
	// Without the cycle's state the score gathers the tracker's own, where
	// both nodes are empty.
	if scores, _ := f.scores(pod, []string{"node-a", "node-b"}); scores["node-a"] != scores["node-b"] {
		t.Errorf("with the tracker's empty state the nodes scored %v, want equal", scores)
	}
}

// migAndWhole gives every GPU 1x groups and seven 1g.10gb MIG instances;
// a GPU holds one or the other at a time (the counters keep them apart).
const migAndWhole = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}}
`

// A MIG instance takes its memory slices and its share of the GPU, not
// the whole GPU: pack puts the next MIG seat on the node whose GPU is
// already partitioned and has room, not on the node as busy whose GPU a
// whole-GPU group holds, where it would partition a GPU more.
func TestPackPutsMIGSeatsOnPartitionedGPUs(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", migAndWhole}, nodeSpec{"node-b", "dgx-h100", migAndWhole})
	// The resolver learns the classes from the informer, one after the
	// other: the fixture waits for the first.
	f.waitFor("the MIG class", func() bool { return f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/mig-1g.10gb") != nil })
	migClass := f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/mig-1g.10gb")
	_, seat := f.seatPod(migClass.Name, 1)
	if r := f.allocate(seat, "node-a", true); !strings.HasPrefix(r.Devices.Results[0].Device, "g0-mig-1g-10gb-") {
		t.Fatalf("the first MIG seat took %s, want an instance on GPU 0", r.Devices.Results[0].Device)
	}
	_, whole := f.seatPod(class1x, 1)
	if r := f.allocate(whole, "node-b", true); r.Devices.Results[0].Device != "g0-1x" {
		t.Fatalf("the 1x seat took %s, want g0-1x", r.Devices.Results[0].Device)
	}
	pod, _ := f.seatPod(migClass.Name, 1)
	scores, st := f.scores(pod, []string{"node-a", "node-b"})
	if scores == nil {
		t.Fatalf("PreScore: %v", st)
	}
	if scores["node-a"] <= scores["node-b"] {
		t.Errorf("pack scored node-a (GPU 0 partitioned, six instances free) %d and node-b (GPU 0 a 1x group's) %d; want node-a first", scores["node-a"], scores["node-b"])
	}
}

// The nodes are predicted several at once in the scheduler (its
// parallelizer, as Filter and Score run): the scores are the ones of a
// prediction node after node (and -race finds no shared write).
func TestNodesPredictedInParallelScoreAsOneAfterTheOther(t *testing.T) {
	var specs []nodeSpec
	for i := range 12 {
		specs = append(specs, nodeSpec{fmt.Sprintf("node-%02d", i), "dgx-h100", threeProfiles})
	}
	f := newFixture(t, Args{DefaultPolicy: Topology}, specs...)
	for i, node := range f.nodes {
		for range i % 5 {
			_, claim := f.seatPod(class1x, 1)
			f.allocate(claim, node, i%2 == 0)
		}
	}
	pod, _ := f.seatPod(class2x, 1)
	one, st := f.scores(pod, f.nodes)
	if one == nil {
		t.Fatalf("PreScore: %v", st)
	}
	schedmetrics.Register() // the parallelizer counts its goroutines
	f.plugin.parallel = parallelize.NewParallelizer(parallelize.DefaultParallelism)
	for range 5 {
		if many, st := f.scores(pod, f.nodes); !maps.Equal(many, one) {
			t.Fatalf("in parallel the nodes scored %v (%v), one after the other %v", many, st, one)
		}
	}
}
