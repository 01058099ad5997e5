package placement

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// A node that publishes no groups larger than the pod's never breaks one,
// and so would rank first wherever the pod breaks a group elsewhere: a
// node broken into would attract the cluster's pods. Empty, it ranks with
// an honest empty node of its GPUs (node-a), not above it, and below a
// node in use where the pod breaks fewer groups than an honest empty node
// would (node-c: its seat breaks one pair, on node-a it breaks a pair and
// a quad), under pack and topology alike.
func TestANodeWithoutLargerGroupsRanksNoBetterThanAnHonestOne(t *testing.T) {
	for _, tc := range []struct {
		name string
		// config is node-b's: no group larger than the pod's.
		config, class string
		// busy: the GPUs of node-c's seats, of class busyClass.
		busyClass string
		busy      []string
	}{
		{name: "one-GPU groups alone", config: "profiles:\n- {resource: kyb.ai/gpu-1x-seat}\n", class: class1x,
			busyClass: class1x, busy: []string{"0", "1"}},
		{name: "no four-GPU groups", config: "profiles:\n- {resource: kyb.ai/gpu-1x-seat}\n- {resource: kyb.ai/gpu-2x-seat}\n", class: class2x,
			busyClass: class4x, busy: []string{"0,1,2,3"}},
	} {
		for _, policy := range []Policy{Pack, Topology} {
			t.Run(tc.name+"/"+string(policy), func(t *testing.T) {
				f := newFixture(t, Args{DefaultPolicy: policy},
					nodeSpec{"node-a", "dgx-h100", threeProfiles}, nodeSpec{"node-b", "dgx-h100", tc.config}, nodeSpec{"node-c", "dgx-h100", threeProfiles})
				for _, gpus := range tc.busy {
					_, claim := f.seatPod(tc.busyClass, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+gpus+`"`))
					f.allocate(claim, "node-c", true)
				}
				pod, claim := f.seatPod(tc.class, 1)
				state := framework.NewCycleState()
				scores, st := f.scoresIn(state, pod, f.feasibleWith(f.cycleAllocator(state, pod), claim))
				if scores == nil {
					t.Fatal(st)
				}
				// The keys: normalized, pack's lead of the node in use hides
				// the empty nodes' difference.
				keys, err := readScores(state)
				if err != nil {
					t.Fatal(err)
				}
				if b, a := keys.keys["node-b"], keys.keys["node-a"]; b > a {
					t.Errorf("%s ranks node-b (key %d) above the honest empty node-a (key %d)", policy, b, a)
				}
				if scores["node-c"] != 100 {
					t.Errorf("%s scored %v, want node-c, in use, at 100", policy, scores)
				}
			})
		}
	}
}

// A node broken into controls every field of its devices, not only which
// groups it publishes: seats that consume no GPU's counter and name no GPU
// index (or only indices past the driver's 32) take no GPU at all as the
// score reads them, so the pod never breaks a group there, and the bound
// an honest empty node of its GPUs gets (at least the groups an honest
// node loses) is not applied. Its class selects them all the same (the
// profile attribute), and the allocator hands them out. Empty, such a node
// must rank no better than an honest empty node.
func TestANodeWhoseSeatsNameNoGPURanksNoBetterThanAnHonestOne(t *testing.T) {
	for _, policy := range []Policy{Pack, Topology} {
		t.Run(string(policy), func(t *testing.T) {
			f := newFixture(t, Args{DefaultPolicy: policy}, nodeSpec{"node-a", "dgx-h100", threeProfiles})
			plan, inv := planNode(t, f.ctx, nodeSpec{"node-b", "dgx-h100", threeProfiles})
			res := draresources.Resources(plan, inv, "node-b", draresources.LayoutShared)
			for _, p := range res.Pools {
				for i := range p.Slices {
					for j := range p.Slices[i].Devices {
						d := &p.Slices[i].Devices[j]
						d.ConsumesCounters = nil
						delete(d.Attributes, resourceapi.QualifiedName(v1alpha1.AttrGPUIndices))
					}
				}
			}
			before := len(f.sim.Slices())
			f.sim.AddNode("node-b", res, driver.Name)
			for _, s := range f.sim.Slices()[before:] {
				s := s.DeepCopy()
				s.UID, s.ResourceVersion = types.UID("uid-"+s.Name), "1"
				f.create(s)
			}
			f.nodes = append(f.nodes, "node-b")
			f.waitFor("node-b's slices", func() bool {
				s, err := f.dra.ResourceSlices().ListWithDeviceTaintRules()
				return err == nil && len(s) == len(f.sim.Slices())
			})

			pod, claim := f.seatPod(class1x, 1)
			state := framework.NewCycleState()
			feasible := f.feasibleWith(f.cycleAllocator(state, pod), claim)
			if !slices.Contains(feasible, "node-b") || !slices.Contains(feasible, "node-a") {
				t.Fatalf("feasible nodes %v, want node-a and node-b", feasible)
			}
			if scores, st := f.scoresIn(state, pod, feasible); scores == nil {
				t.Fatal(st)
			}
			keys, err := readScores(state)
			if err != nil {
				t.Fatal(err)
			}
			if b, a := keys.keys["node-b"], keys.keys["node-a"]; b > a {
				t.Errorf("%s ranks node-b, whose seats name no GPU (key %d), above the honest empty node-a (key %d)", policy, b, a)
			}
		})
	}
}
