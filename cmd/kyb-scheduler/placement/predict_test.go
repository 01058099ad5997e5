package placement

import (
	"strings"
	"testing"

	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// The allocator looks for a request's next device after the one it took
// last, so that it tries combinations of devices, not permutations: a
// request for two seats of shared groups takes two groups even where the
// first has seats left. The score predicts the same two groups: one
// joining the group in use, one more.
func TestTwoDevicesOfOneRequestAreTwoSharedGroups(t *testing.T) {
	const fourSeats = "profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}\n- {resource: kyb.ai/gpu-2x-seat}\n"
	for _, policy := range []Policy{Pack, Topology, Spread} {
		t.Run(string(policy), func(t *testing.T) {
			f := newFixture(t, Args{DefaultPolicy: policy}, nodeSpec{"node-a", "dgx-h100", fourSeats})
			_, busy := f.seatPod(class1x, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
			f.allocate(busy, "node-a", true)

			pod, claim := f.seatPod(class1x, 2)
			state := framework.NewCycleState()
			a := f.cycleAllocator(state, pod)
			r, err := f.sim.Try(f.ctx, a, claim, "node-a")
			if err != nil || r == nil {
				t.Fatalf("the pod does not fit: %v", err)
			}
			// g0-1x, the group in use, first in the published order and
			// in the policies' own.
			got := []string{r.Devices.Results[0].Device, r.Devices.Results[1].Device}
			if got[0] == got[1] || !strings.HasPrefix(got[0], "g0-1x") {
				t.Fatalf("the allocator took %v, want g0-1x and another group", got)
			}
			o := f.prediction(state, pod, "node-a")
			if o.picks != 2 || o.joined != 1 || o.busy != 1 {
				t.Errorf("predicted %+v for %v: want two groups, one of them joining the group in use on GPU 0", o, got)
			}
		})
	}
}
