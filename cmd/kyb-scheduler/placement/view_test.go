package placement

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
)

// sharedSeats is four seats per one-GPU group (shared devices that
// publish seats) beside plain two-GPU groups.
const sharedSeats = "profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}\n- {resource: kyb.ai/gpu-2x-seat}\n"

// cycle is what one pod's scheduling cycle made of the plugin's work: the
// nodes' scores and the keys they were normalized from, the device order
// handed to the allocator (each slice's device names, by node) and the
// pools' states.
type cycle struct {
	scores map[string]int64
	keys   map[string]int64
	order  map[string][]string
	set    *poolSet
	states []*ordered
}

// runCycle runs pl over pod as kyb-scheduler's built-in profile does:
// PreFilter, the device order in the DynamicResources plugin's PreFilter
// (over the allocated state gathered now), then PreScore, Score and
// NormalizeScore on every node.
func (f *fixture) runCycle(pl *Plugin, pod *v1.Pod) cycle {
	f.t.Helper()
	listed, gathered := f.snapshot()
	state := framework.NewCycleState()
	state.Write(dynamicresources.AllocatedStateKey, &dynamicresources.AllocatedStateData{State: gathered})
	if _, st := pl.PreFilter(f.ctx, state, pod, nil); !st.IsSuccess() {
		f.t.Fatalf("PreFilter %s: %v", pod.Name, st)
	}
	o := cycleOrder(state)
	c := cycle{order: map[string][]string{}}
	for _, s := range o.OrderDevices(f.ctx, gathered, listed) {
		if s.Spec.NodeName == nil {
			continue
		}
		for _, d := range s.Spec.Devices {
			c.order[*s.Spec.NodeName] = append(c.order[*s.Spec.NodeName], d.Name)
		}
	}
	c.set, c.states = o.set, o.states
	saved := f.plugin
	f.plugin = pl
	defer func() { f.plugin = saved }()
	c.scores, _ = f.scoresIn(state, pod, f.nodes)
	if c.scores == nil {
		f.t.Fatalf("PreScore %s failed", pod.Name)
	}
	if s, err := readScores(state); err == nil {
		c.keys = s.keys
	}
	return c
}

// allocationOf is the device a claim in flight or allocated got.
func (f *fixture) allocationOf(claim *resourceapi.ResourceClaim) string {
	f.t.Helper()
	if r := f.dra.ResourceClaims().GetPendingAllocation(claim.UID); r != nil {
		return r.Devices.Results[0].Device
	}
	c, err := f.dra.ResourceClaims().Get(claim.Namespace, claim.Name)
	if err != nil || c.Status.Allocation == nil {
		f.t.Fatalf("%s is not allocated: %v", claim.Name, err)
	}
	return c.Status.Allocation.Devices.Results[0].Device
}

// A pool's state under the cycle's allocations (its device order and the
// predictions made from it) is kept while the node's allocations stay
// the same: the next pod orders and predicts again only the node the
// last one went to, and a node whose claim is freed is ordered again as
// well.
func TestOnlyNodesWhoseAllocationsChangedAreOrderedAgain(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack},
		nodeSpec{"node-a", "dgx-h100", threeProfiles}, nodeSpec{"node-b", "dgx-h100", sharedSeats}, nodeSpec{"node-c", "dgx-h100", threeProfiles})
	pod, _ := f.seatPod(class1x, 1)
	before := f.runCycle(f.plugin, pod)

	_, onA := f.seatPod(class1x, 1)
	f.allocate(onA, "node-a", true)
	_, onB := f.seatPod(class1x, 1)
	f.allocate(onB, "node-b", false)
	after := f.runCycle(f.plugin, pod)
	if after.set != before.set {
		t.Fatal("the pools were parsed again: no slice changed")
	}
	kept := func(c1, c2 cycle, node string) bool {
		k := c1.set.slot[node]
		return c1.states[k] == c2.states[k]
	}
	for node, want := range map[string]bool{"node-a": false, "node-b": false, "node-c": true} {
		if got := kept(before, after, node); got != want {
			t.Errorf("after a seat on node-a (written) and one on node-b (in flight): %s kept its state: %t, want %t", node, got, want)
		}
	}
	k := after.set.slot["node-b"]
	if !slices.Contains(after.states[k].inUse, true) || !slices.Contains(after.states[k].seats, 1) {
		t.Errorf("node-b's state %v, seats %v: want the in-flight share's group in use, one seat", after.states[k].inUse, after.states[k].seats)
	}

	// A second share of node-b's group: the same devices in use, one more
	// seat taken.
	_, again := f.seatPod(class1x, 1)
	if r := f.allocate(again, "node-b", false); r.Devices.Results[0].Device != f.allocationOf(onB) {
		t.Fatalf("the second share took %s, want the group in use, %s", r.Devices.Results[0].Device, f.allocationOf(onB))
	}
	shared := f.runCycle(f.plugin, pod)
	if kept(after, shared, "node-b") || !slices.Contains(shared.states[k].seats, 2) {
		t.Errorf("after a second share of node-b's group: state kept %t, seats %v; want a new state with two seats", kept(after, shared, "node-b"), shared.states[k].seats)
	}
	if !f.dra.ResourceClaims().MaybeRemoveClaimPendingAllocation(again.UID, true) {
		t.Fatal("the second share was not in flight")
	}

	// Freed: the written claim deleted, the in-flight one dropped.
	if err := f.client.ResourceV1().ResourceClaims(onA.Namespace).Delete(f.ctx, onA.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the claim's deletion", func() bool { _, err := f.dra.ResourceClaims().Get(onA.Namespace, onA.Name); return err != nil })
	if !f.dra.ResourceClaims().MaybeRemoveClaimPendingAllocation(onB.UID, true) {
		t.Fatal("node-b's claim was not in flight")
	}
	freed := f.runCycle(f.plugin, pod)
	for _, node := range f.nodes {
		k := freed.set.slot[node]
		if slices.Contains(freed.states[k].inUse, true) {
			t.Errorf("%s: devices still in use %v after every claim was freed", node, freed.states[k].inUse)
		}
		if node == "node-c" && !kept(after, freed, node) {
			t.Errorf("node-c was ordered again, though nothing of it changed")
		}
	}
	if !maps.Equal(freed.scores, before.scores) || !maps.EqualFunc(freed.order, before.order, slices.Equal) {
		t.Errorf("freed: scores %v, order %v; want those of the empty cluster, %v, %v", freed.scores, freed.order, before.scores, before.order)
	}
}

// Kept states never change what the score decides: over a random stream
// of allocations (written and in flight, plain devices, shared groups
// with seats, MIG instances, sized seats of mixed sizes) and releases, a
// plugin that has scheduled
// every pod before gives each new pod (of any class, count and policy,
// or asking for an extended resource) the scores and device order a
// plugin started for that pod alone gives it.
func TestKeptStatesScoreAsAFreshPlugin(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack},
		nodeSpec{"node-a", "dgx-h100", threeProfiles}, nodeSpec{"node-b", "dgx-h100", sharedSeats},
		nodeSpec{"node-c", "dgx-h100", migAndWhole}, nodeSpec{"node-d", "dgx-h100", threeProfiles},
		nodeSpec{"node-e", "dgx-h100", sizedGroups}, nodeSpec{"node-f", "dgx-h200", sizedGroups})
	f.waitFor("the MIG class", func() bool { return f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/mig-1g.10gb") != nil })
	classes := []string{class1x, class2x, f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/mig-1g.10gb").Name, classSized, classSized2x}
	// Sizes of sized claims: the default, and memory and compute of
	// every scale.
	sizes := [][2]string{{"", ""}, {"6Gi", ""}, {"20Gi", "25"}, {"33.5Gi", ""}, {"60Gi", "40"}, {"2Gi", "70"}}
	sizeOf := func(class string, k int) []func(*resourceapi.DeviceRequest) {
		if class != classSized && class != classSized2x {
			return nil
		}
		return []func(*resourceapi.DeviceRequest){sized(sizes[k%len(sizes)][0], sizes[k%len(sizes)][1])}
	}
	policies := []Policy{Pack, Topology, Spread}
	type held struct {
		claim       *resourceapi.ResourceClaim
		result      *resourceapi.AllocationResult
		class, node string
		written     bool
	}
	var holding []held
	free := func(i int) held {
		h := holding[i]
		holding = slices.Delete(holding, i, i+1)
		if h.written {
			if err := f.client.ResourceV1().ResourceClaims(h.claim.Namespace).Delete(f.ctx, h.claim.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			f.waitFor("the deletion of "+h.claim.Name, func() bool { _, err := f.dra.ResourceClaims().Get(h.claim.Namespace, h.claim.Name); return err != nil })
		} else {
			f.dra.ResourceClaims().MaybeRemoveClaimPendingAllocation(h.claim.UID, true)
		}
		f.sim.Release(h.result)
		return h
	}
	rng := rand.New(rand.NewPCG(1, 37))
	for step := range 60 {
		what := ""
		sizedHeld := slices.IndexFunc(holding, func(h held) bool { return h.class == classSized })
		switch {
		case step%5 == 4 && sizedHeld >= 0:
			// A sized share freed and another of another size taken on
			// its group: the group's seats stay, its memory does not.
			device := f.allocationOf(holding[sizedHeld].claim)
			h := free(sizedHeld)
			gpu := strings.TrimSuffix(strings.TrimPrefix(device, "g"), "-1x-sized")
			_, claim := f.seatPod(classSized, 1, sized(fmt.Sprintf("%dGi", 1+rng.IntN(2)), "1"), onGPU(gpu))
			r := f.allocate(claim, h.node, h.written)
			holding = append(holding, held{claim, r, classSized, h.node, h.written})
			what = fmt.Sprintf("swapped %s for %s on %s/%s", h.claim.Name, claim.Name, h.node, device)
		case len(holding) > 0 && rng.IntN(3) == 0:
			h := free(rng.IntN(len(holding)))
			what = "freed " + h.claim.Name
		default:
			class := classes[rng.IntN(len(classes))]
			_, claim := f.seatPod(class, 1, sizeOf(class, rng.IntN(len(sizes)))...)
			nodes := f.feasible(claim)
			if len(nodes) == 0 {
				continue
			}
			node := nodes[rng.IntN(len(nodes))]
			written := rng.IntN(2) == 0
			r := f.allocate(claim, node, written)
			holding = append(holding, held{claim, r, class, node, written})
			what = fmt.Sprintf("%s on %s (written %t)", class, node, written)
		}
		// Pods of every class, of one device or two, under every policy,
		// and one asking for seats as an extended resource: each kind of
		// pod keeps predictions of its own.
		pods := map[string]*v1.Pod{}
		for j, class := range classes {
			count, policy := int64(1+(step+j)%2), policies[(step+j)%len(policies)]
			pod, _ := f.seatPod(class, count, sizeOf(class, step+j)...)
			pod.Annotations = map[string]string{PolicyAnnotation: string(policy)}
			pods[fmt.Sprintf("%s, %d devices, %s", class, count, policy)] = pod
		}
		pods["extended-resource"] = f.extendedPod("kyb.ai/gpu-1x-seat", int64(1+step%2))
		for _, name := range slices.Sorted(maps.Keys(pods)) {
			pod := pods[name]
			kept := f.runCycle(f.plugin, pod)
			fresh := f.runCycle(NewWithManager(Args{DefaultPolicy: Pack}, f.dra), pod)
			if !maps.Equal(kept.scores, fresh.scores) || !maps.Equal(kept.keys, fresh.keys) {
				t.Errorf("step %d, after %s: a %s pod scored %v (keys %v) by the plugin that kept its states, %v (%v) by a fresh one", step, what, name, kept.scores, kept.keys, fresh.scores, fresh.keys)
			}
			if !maps.EqualFunc(kept.order, fresh.order, slices.Equal) {
				t.Errorf("step %d, after %s: a %s pod's device order %v by the plugin that kept its states, %v by a fresh one", step, what, name, kept.order, fresh.order)
			}
		}
	}
}
