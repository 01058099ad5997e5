package placement

import (
	"testing"

	"k8s.io/kubernetes/pkg/scheduler/framework"

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
