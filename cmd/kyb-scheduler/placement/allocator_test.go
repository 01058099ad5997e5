package placement

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// The score's view of a node against the real allocator's: handed the
// same slices and allocated state (the DynamicResources PreFilter hands
// the device order both), the score predicts the devices the allocator
// takes.

// republish publishes n's pools anew, one per name, in the cluster the
// allocator sees, as the driver does once its configuration changed; the
// allocations made before stay, as their pods run on.
func (f *fixture) republish(n nodeSpec, pools ...string) {
	f.t.Helper()
	plan, inv := planNode(f.t, f.ctx, n)
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
	for _, pool := range pools {
		maps.Copy(res.Pools, draresources.Resources(plan, inv, pool, draresources.LayoutShared).Pools)
	}
	f.sim.SetNode(n.name, res, driver.Name)
}

// predictedDevices are the devices ("pool/device", sorted) the score
// predicts the cycle's pod takes on node, from the cycle's device order.
func (f *fixture) predictedDevices(state fwk.CycleState, node string) []string {
	f.t.Helper()
	o := cycleOrder(state)
	if o == nil || o.states == nil {
		f.t.Fatal("the cycle has no device order")
	}
	k, ok := o.set.slot[node]
	if !ok {
		f.t.Fatalf("no pool of ours on %s", node)
	}
	p := o.set.list[k]
	s := &scratch{}
	predict(f.ctx, f.plugin.cel, p, o.reqs, orderApplied(state), o.states[k], s)
	out := []string{}
	for _, i := range s.picked {
		out = append(out, p.devices[i].id.Pool.String()+"/"+p.devices[i].name)
	}
	slices.Sort(out)
	return out
}

// allocatedDevices are an allocation's devices as predictedDevices names
// them.
func allocatedDevices(r *resourceapi.AllocationResult) []string {
	out := []string{}
	for _, d := range r.Devices.Results {
		out = append(out, d.Pool+"/"+d.Device)
	}
	slices.Sort(out)
	return out
}

// A profile republished with more or fewer seats keeps its devices'
// names while the pods that hold them run on: a whole allocation then
// holds a device now shared, or shares a device now ordinary. The
// allocator gives the first no share and leaves the second no room (its
// counters stay charged), and so does the score: the pod's seat goes
// beside the device held, and the node counts as in use.
func TestDevicesRepublishedAsAnotherKindStayInUse(t *testing.T) {
	for _, tc := range []struct{ name, before, after string }{
		{"a whole allocation of a device now shared", threeProfiles, sharedSeats},
		{"a share of a device now ordinary", sharedSeats, threeProfiles},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", tc.before}, nodeSpec{"node-b", "dgx-h100", tc.after})
			_, held := f.seatPod(class1x, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
			if r := f.allocate(held, "node-a", true); r.Devices.Results[0].Device != "g0-1x" {
				t.Fatalf("the first seat took %s, want g0-1x", r.Devices.Results[0].Device)
			}
			f.republish(nodeSpec{"node-a", "dgx-h100", tc.after}, "node-a")

			pod, claim := f.seatPod(class1x, 1)
			state, a := f.takenAndPredicted(pod, claim, "node-a", "node-a/g1-1x")
			scores, st := f.scoresIn(state, pod, f.feasibleWith(a, claim))
			if want := map[string]int64{"node-a": 100, "node-b": 0}; !maps.Equal(scores, want) {
				t.Errorf("pack scored %v (%v), want %v: node-a is in use", scores, st, want)
			}
		})
	}
}

// A node may publish two pools of the driver (a pool being renamed, the
// old one until it is deleted), each with a counter set of the same
// name. The allocator keeps each pool's counters apart: a pool whose GPUs
// are all taken leaves the other's free, and the score predicts the
// device the allocator takes there.
func TestTwoPoolsOfANodeKeepTheirCountersApart(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", threeProfiles})
	f.republish(nodeSpec{"node-a", "dgx-h100", threeProfiles}, "node-a", "node-a-1")
	for range 2 {
		_, quad := f.seatPod(class4x, 1)
		if r := f.allocate(quad, "node-a", true); r.Devices.Results[0].Pool != "node-a" {
			t.Fatalf("a 4x seat took %s/%s, want a group of pool node-a", r.Devices.Results[0].Pool, r.Devices.Results[0].Device)
		}
	}
	pod, claim := f.seatPod(class1x, 1)
	f.takenAndPredicted(pod, claim, "node-a", "node-a-1/g0-1x")
}

// takenAndPredicted runs a cycle of pod with the allocator the cycle's
// device order is handed to, and checks that on node it takes want and
// that the score predicts what it takes. It returns the cycle and its
// allocator.
func (f *fixture) takenAndPredicted(pod *v1.Pod, claim *resourceapi.ResourceClaim, node string, want ...string) (fwk.CycleState, structured.Allocator) {
	f.t.Helper()
	state := framework.NewCycleState()
	a := f.cycleAllocator(state, pod)
	r, err := f.sim.Try(f.ctx, a, claim, node)
	if err != nil || r == nil {
		f.t.Fatalf("the pod does not fit %s: %v", node, err)
	}
	if got := allocatedDevices(r); !slices.Equal(got, want) {
		f.t.Errorf("the allocator took %v on %s, want %v", got, node, want)
	}
	if got, took := f.predictedDevices(state, node), allocatedDevices(r); !slices.Equal(got, took) {
		f.t.Errorf("the score predicts %v on %s, the allocator takes %v", got, node, took)
	}
	return state, a
}

// firstAvailable makes a request a firstAvailable one of one device of
// each class, in order.
func firstAvailable(classes ...string) func(*resourceapi.DeviceRequest) {
	return func(r *resourceapi.DeviceRequest) {
		r.Exactly = nil
		for i, c := range classes {
			r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{
				Name: fmt.Sprintf("alt%d", i), DeviceClassName: c, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			})
		}
	}
}

// Over a random stream of pods of every shape the score predicts (one
// device or two, seats of shared groups, MIG instances, a firstAvailable
// request's alternatives), under every policy, allocated and freed at
// random, on nodes republished with another kind of groups and a node of
// two pools, the devices the score predicts a pod takes on a node are
// the ones the real allocator, handed the cycle's device order, takes
// there: on every node that fits, at every step.
func TestPredictionsTakeWhatTheAllocatorTakes(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack},
		nodeSpec{"node-a", "dgx-h100", threeProfiles}, nodeSpec{"node-b", "dgx-h100", sharedSeats},
		nodeSpec{"node-c", "dgx-h100", migAndWhole}, nodeSpec{"node-d", "dgx-h100", threeProfiles},
		nodeSpec{"node-e", "dgx-h100", sizedGroups}, nodeSpec{"node-f", "dgx-h200", sizedGroups})
	f.waitFor("the MIG class", func() bool { return f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/mig-1g.10gb") != nil })
	mig := f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/mig-1g.10gb").Name
	ask := func(memory, compute string) []func(*resourceapi.DeviceRequest) {
		return []func(*resourceapi.DeviceRequest){sized(memory, compute)}
	}
	type shape struct {
		name   string
		class  string
		count  int64
		mutate []func(*resourceapi.DeviceRequest)
	}
	shapes := []shape{
		{name: "1x", class: class1x, count: 1},
		{name: "two 1x", class: class1x, count: 2},
		{name: "2x", class: class2x, count: 1},
		{name: "4x", class: class4x, count: 1},
		{name: "two seats of a 1x group", class: class1x, count: 1, mutate: []func(*resourceapi.DeviceRequest){schedulertest.WithCapacity("seats", "2")}},
		{name: "MIG", class: mig, count: 1},
		{name: "two MIG", class: mig, count: 2},
		{name: "2x, else 1x", class: class2x, count: 1, mutate: []func(*resourceapi.DeviceRequest){firstAvailable(class2x, class1x)}},
		{name: "MIG, else 1x", class: mig, count: 1, mutate: []func(*resourceapi.DeviceRequest){firstAvailable(mig, class1x)}},
		// Sized seats of mixed sizes: the default, small and large ones,
		// off the step, below the minimum, compute-bound, two of them, a
		// pair's, and a size asked first of a profile that is not sized
		// (no group there has the capacity).
		{name: "sized, default", class: classSized, count: 1},
		{name: "sized 4Gi", class: classSized, count: 1, mutate: ask("4Gi", "")},
		{name: "sized 10Gi 10%", class: classSized, count: 1, mutate: ask("10Gi", "10")},
		{name: "sized 24.5Gi", class: classSized, count: 1, mutate: ask("24.5Gi", "")},
		{name: "sized 40Gi 30%", class: classSized, count: 1, mutate: ask("40Gi", "30")},
		{name: "sized 70Gi", class: classSized, count: 1, mutate: ask("70Gi", "")},
		{name: "sized 100Mi 60%", class: classSized, count: 1, mutate: ask("100Mi", "60")},
		{name: "two sized 16Gi", class: classSized, count: 2, mutate: ask("16Gi", "")},
		{name: "sized pair 30Gi", class: classSized2x, count: 1, mutate: ask("30Gi", "25")},
		{name: "sized 2x 50Gi, else 1x", class: classSized2x, count: 1, mutate: []func(*resourceapi.DeviceRequest){firstAvailable(classSized2x, classSized), sizedSubRequests("50Gi")}},
		{name: "1x 8Gi, else sized", class: class1x, count: 1, mutate: []func(*resourceapi.DeviceRequest){firstAvailable(class1x, classSized), sizedSubRequests("8Gi")}},
	}
	policies := []Policy{Pack, Topology, Spread}
	var held []*resourceapi.AllocationResult
	// compared counts the nodes each shape was compared on, so that no
	// shape passes by never fitting.
	compared := map[string]int{}
	rng := rand.New(rand.NewPCG(7, 11))
	// node-d publishes two pools alike; node-b is republished now and
	// then with the other kind of 1x groups, its allocations staying.
	f.republish(nodeSpec{"node-d", "dgx-h100", threeProfiles}, "node-d", "node-d-1")
	configs := []string{sharedSeats, threeProfiles}
	for step := range 300 {
		if step%30 == 29 {
			f.republish(nodeSpec{"node-b", "dgx-h100", configs[(step/30+1)%2]}, "node-b")
		}
		if len(held) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(held))
			f.sim.Release(held[i])
			held = slices.Delete(held, i, i+1)
			continue
		}
		sh := shapes[rng.IntN(len(shapes))]
		policy := policies[rng.IntN(len(policies))]
		pod, claim := f.seatPod(sh.class, sh.count, sh.mutate...)
		pod.Annotations = map[string]string{PolicyAnnotation: string(policy)}
		state := framework.NewCycleState()
		a := f.cycleAllocator(state, pod)
		var fits []*resourceapi.AllocationResult
		for _, node := range f.nodes {
			r, err := f.sim.Try(f.ctx, a, claim, node)
			if err != nil {
				t.Fatal(err)
			}
			if r == nil {
				continue
			}
			fits = append(fits, r)
			compared[sh.name]++
			if got, want := f.predictedDevices(state, node), allocatedDevices(r); !slices.Equal(got, want) {
				t.Errorf("step %d, a %s pod under %s: the score predicts %v on %s, the allocator takes %v", step, sh.name, policy, got, node, want)
			}
		}
		if len(fits) == 0 {
			continue
		}
		r := fits[rng.IntN(len(fits))]
		f.sim.Record(r)
		held = append(held, r)
	}
	for _, sh := range shapes {
		if compared[sh.name] == 0 {
			t.Errorf("a %s pod fit no node at any step: nothing was compared", sh.name)
		}
	}
	t.Logf("nodes compared, by shape: %v", compared)
}

// The claim the scheduler makes for a pod's extended resources has a
// request per container: two containers asking for a seat each take two
// shares, of the group in use where it has seats left, where one
// container asking for two seats takes two groups (a request's devices
// are distinct). The score predicts the devices the allocator takes for
// the claim the DynamicResources plugin makes (one request per container,
// named container-<index>-request-<index of the resource>).
func TestExtendedResourcesAreRequestedPerContainer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		containers []int64
		want       []string
	}{
		{"one container, two seats", []int64{2}, []string{"node-a/g0-1x", "node-a/g1-1x"}},
		{"two containers, a seat each", []int64{1, 1}, []string{"node-a/g0-1x", "node-a/g0-1x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Args{DefaultPolicy: Pack}, nodeSpec{"node-a", "dgx-h100", sharedSeats})
			_, held := f.seatPod(class1x, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
			f.allocate(held, "node-a", true)

			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "extended", Namespace: "default", UID: "uid-extended"}}
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "extended-claim", Namespace: "default", UID: "uid-extended-claim"}}
			for i, n := range tc.containers {
				q := v1.ResourceList{"kyb.ai/gpu-1x-seat": *resource.NewQuantity(n, resource.DecimalSI)}
				pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{Name: fmt.Sprintf("app-%d", i), Resources: v1.ResourceRequirements{Limits: q, Requests: q}})
				claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourceapi.DeviceRequest{
					Name:    fmt.Sprintf("container-%d-request-0", i),
					Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class1x, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: n},
				})
			}
			state := framework.NewCycleState()
			a := f.cycleAllocator(state, pod)
			r, err := f.sim.Try(f.ctx, a, claim, "node-a")
			if err != nil || r == nil {
				t.Fatalf("the pod does not fit node-a: %v", err)
			}
			if got := allocatedDevices(r); !slices.Equal(got, tc.want) {
				t.Errorf("the allocator took %v, want %v", got, tc.want)
			}
			if got, want := f.predictedDevices(state, "node-a"), allocatedDevices(r); !slices.Equal(got, want) {
				t.Errorf("the score predicts %v, the allocator takes %v", got, want)
			}
		})
	}
}
