package placement

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// Within a node the real allocator, handed the slices in the pod's device
// order, takes the group pack and topology want: a seat beside a busy GPU
// rather than one that breaks an idle pair, a share of the group in use
// rather than a fresh group, a MIG instance on the GPU already
// partitioned. Without the order (spread, or a profile whose
// DynamicResources PreFilter runs first) it takes the first group of the
// published order, and the score predicts whichever the allocator takes.
func TestDeviceOrderChoosesTheGroupWithinTheNode(t *testing.T) {
	const fourSeats = "profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}\n- {resource: kyb.ai/gpu-2x-seat}\n"
	for _, tc := range []struct {
		name, config string
		// busy: the class and GPU of a seat allocated first.
		busyClass, busyGPU string
		// class of the pod; want: its device with the order and without.
		class, ordered, published string
		// joins: the ordered device joins GPUs in use.
		joins bool
	}{
		{name: "a seat beside a busy GPU", config: threeProfiles, busyClass: class1x, busyGPU: "3",
			class: class1x, ordered: "g2-1x", published: "g0-1x"},
		{name: "a share of the group in use", config: fourSeats, busyClass: class1x, busyGPU: "5",
			class: class1x, ordered: "g5-1x", published: "g0-1x", joins: true},
		{name: "a MIG instance on the partitioned GPU", config: migAndWhole, busyClass: "mig-1g.10gb.kyb.ai", busyGPU: "3",
			class: "mig-1g.10gb.kyb.ai", ordered: "g3-mig-1g-10gb-", published: "g0-mig-1g-10gb-", joins: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, policy := range []Policy{Pack, Topology, Spread} {
				f := newFixture(t, Args{DefaultPolicy: policy}, nodeSpec{"node-a", "dgx-h100", tc.config})
				_, busy := f.seatPod(tc.busyClass, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+tc.busyGPU+`"`))
				f.allocate(busy, "node-a", true)

				pod, claim := f.seatPod(tc.class, 1)
				state := framework.NewCycleState()
				a := f.cycleAllocator(state, pod)
				r, err := f.sim.Try(f.ctx, a, claim, "node-a")
				if err != nil || r == nil {
					t.Fatalf("%s: the pod does not fit: %v", policy, err)
				}
				want := tc.ordered
				if policy == Spread {
					want = tc.published
				}
				got := r.Devices.Results[0].Device
				if !strings.HasPrefix(got, want) {
					t.Errorf("%s: the allocator took %s, want %s…", policy, got, want)
				}
				if !orderApplied(state) && policy != Spread {
					t.Errorf("%s: the order was not applied", policy)
				}
				// The score predicts the device the allocator took.
				if o := f.prediction(state, pod, "node-a"); o.picks != 1 || o.joined != boolInt(tc.joins && policy != Spread) {
					t.Errorf("%s: predicted %+v for %s", policy, o, got)
				}
			}
		})
	}
}

// Without KybPlacement's PreFilter first, the allocator keeps the
// published order, and the score predicts that order.
func TestWithoutTheOrderThePublishedOrderIsPredicted(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", threeProfiles})
	_, busy := f.seatPod(class1x, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "3"`))
	f.allocate(busy, "node-a", true)
	pod, claim := f.seatPod(class1x, 1)
	a, err := f.sim.Allocator(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := f.sim.Try(f.ctx, a, claim, "node-a")
	if err != nil || r == nil || r.Devices.Results[0].Device != "g0-1x" {
		t.Fatalf("the stock order took %v (%v), want g0-1x", r, err)
	}
	// g0-1x breaks the idle pair g0/g1; g2-1x would break nothing.
	if o := f.prediction(framework.NewCycleState(), pod, "node-a"); o.broken != 1 {
		t.Errorf("predicted %+v, want the published order's first 1x group, breaking one idle pair", o)
	}
}

// A node's reordered slices are kept while its allocations stay the same,
// so that the allocator's cache of built pools keeps them too; the
// originals are never modified.
func TestReorderedSlicesAreKeptWhileTheNodeIsUnchanged(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", threeProfiles})
	_, busy := f.seatPod(class1x, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "3"`))
	f.allocate(busy, "node-a", true)
	published := map[*resourceapi.ResourceSlice][]string{}
	for _, s := range f.sim.Slices() {
		published[s] = deviceNames(s)
	}
	order := func() []*resourceapi.ResourceSlice {
		pod, _ := f.seatPod(class1x, 1)
		state := framework.NewCycleState()
		if _, st := f.plugin.PreFilter(f.ctx, state, pod, nil); !st.IsSuccess() {
			t.Fatal(st)
		}
		var out []*resourceapi.ResourceSlice
		if _, err := f.sim.AllocatorOrdered(f.ctx, func(s *structured.AllocatedState, all []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			d, _ := state.Read(dynamicresources.DeviceOrderKey)
			out = d.(*deviceOrder).OrderDevices(f.ctx, s, all)
			return out
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	first, second := order(), order()
	changed := 0
	for i, s := range first {
		if second[i] != s {
			t.Errorf("slice %s was copied again for the same allocations", s.Name)
		}
		orig := f.sim.Slices()[i]
		if s != orig {
			changed++
			if len(deviceNames(s)) != len(published[orig]) {
				t.Errorf("slice %s: %d devices reordered, %d published", s.Name, len(deviceNames(s)), len(published[orig]))
			}
			// A device moves among its profile's only: one of another
			// profile ahead of the request's is one more selector
			// evaluation for the allocator, which cannot match.
			if got, want := profiles(s), profiles(orig); !slices.Equal(got, want) {
				t.Errorf("slice %s: profiles reordered to %v, published %v", s.Name, got, want)
			}
		}
		if !slices.Equal(deviceNames(orig), published[orig]) {
			t.Errorf("slice %s was modified: %v", orig.Name, deviceNames(orig))
		}
	}
	if changed != 1 {
		t.Errorf("%d slices reordered, want the node's slice of devices", changed)
	}
}

func deviceNames(s *resourceapi.ResourceSlice) []string {
	var out []string
	for _, d := range s.Spec.Devices {
		out = append(out, d.Name)
	}
	return out
}

func profiles(s *resourceapi.ResourceSlice) []string {
	var out []string
	for _, d := range s.Spec.Devices {
		if a, ok := d.Attributes["profile"]; ok && a.StringValue != nil {
			out = append(out, *a.StringValue)
		}
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// prediction is the score's outcome for pod on node in the cycle.
func (f *fixture) prediction(state fwk.CycleState, pod *v1.Pod, node string) outcome {
	f.t.Helper()
	listed, gathered := f.snapshot()
	set := f.plugin.pools.update(f.ctx, listed)
	k, ok := set.slot[node]
	if !ok {
		f.t.Fatalf("no pool of ours on %s", node)
	}
	states := f.plugin.poolStates(f.ctx, set, gathered)
	if o := cycleOrder(state); o != nil && o.states != nil {
		set, states = o.set, o.states
		k = set.slot[node]
	}
	return predict(f.ctx, f.plugin.cel, set.list[k], podRequests(pod, f.dra), orderApplied(state), states[k], &scratch{})
}

// In the scheduler the allocator's order and the score's prediction come
// from the same slices and allocated state: PreScore predicts from the
// allocations the order was computed for, without looking them up again,
// and predicts what it would from the state itself.
func TestPreScorePredictsFromTheCyclesOrder(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", threeProfiles})
	_, busy := f.seatPod(class1x, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "3"`))
	f.allocate(busy, "node-a", true)
	pod, _ := f.seatPod(class1x, 1)
	state := framework.NewCycleState()
	if _, st := f.plugin.PreFilter(f.ctx, state, pod, nil); !st.IsSuccess() {
		t.Fatal(st)
	}
	listed, gathered := f.snapshot()
	state.Write(dynamicresources.AllocatedStateKey, &dynamicresources.AllocatedStateData{State: gathered})
	order := cycleOrder(state)
	order.OrderDevices(f.ctx, gathered, listed)
	set := f.plugin.pools.update(f.ctx, listed)
	k := set.slot["node-a"]
	p, ord := set.list[k], order.states[k]
	if order.set != set || ord == nil {
		t.Fatal("no state of node-a's pool in the cycle")
	}
	var v poolView
	v.gather(set, gathered)
	a := v.sub(set.base[k], set.base[k+1])
	fresh := p.reorder(&a, &scratch{})
	reqs := podRequests(pod, f.dra)
	restored := predict(f.ctx, f.plugin.cel, p, reqs, true, ord, &scratch{})
	looked := predict(f.ctx, f.plugin.cel, p, reqs, true, fresh, &scratch{})
	if restored != looked || restored.broken != 0 || restored.busy != 1 || restored.picks != 1 {
		t.Errorf("predicted %+v from the cycle's order, %+v from the state: want both one seat beside GPU 3, breaking nothing", restored, looked)
	}
	if st := f.plugin.PreScore(f.ctx, state, pod, nodeInfos("node-a")); !st.IsSuccess() {
		t.Fatal(st)
	}
}

// A pod whose claims a plugin gives the cycle as they will be
// (dynamicresources.PodClaims: a pod defragmentation would move, its
// claims made anew) is ordered for those: a running pod whose claim is
// allocated asks for nothing, and the same pod with its claim given
// without an allocation gets the device order for its seat.
func TestGivenClaimsAreThePodsRequests(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", threeProfiles})
	pod, claim := f.seatPod(class1x, 1)
	f.allocate(claim, "node-a", true)
	if _, st := f.plugin.PreFilter(f.ctx, framework.NewCycleState(), pod, nil); st.Code() != fwk.Skip {
		t.Fatalf("PreFilter of a pod whose claim is allocated: %v, want Skip", st)
	}
	fresh := claim.DeepCopy()
	fresh.Status = resourceapi.ResourceClaimStatus{}
	state := framework.NewCycleState()
	state.Write(dynamicresources.PodClaimsKey, &dynamicresources.PodClaims{Claims: []*resourceapi.ResourceClaim{fresh}})
	if _, st := f.plugin.PreFilter(f.ctx, state, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter with the claim given afresh: %v", st)
	}
	o := cycleOrder(state)
	if o == nil || len(o.reqs) != 1 || o.reqs[0].alternatives[0].class.Name != class1x {
		t.Fatalf("device order %+v, want one for a seat of %s", o, class1x)
	}
}
