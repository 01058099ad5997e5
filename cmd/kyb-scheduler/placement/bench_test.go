package placement

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/parallelize"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// BenchmarkScore is the score's work for one seat pod, PreScore and one
// Score per node, as the framework runs them, on clusters of dgx-h100
// nodes each half full (four of eight one-GPU seats allocated, in the
// API server). Slices and classes are parsed at the first pod and reused
// after, as in a running scheduler.
func BenchmarkScore(b *testing.B) {
	for _, n := range []int{100, 500} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			f := halfFull(b, n, nil)
			// As the scheduler runs it: nodes predicted several at once.
			schedmetrics.Register() // the parallelizer counts its goroutines
			f.plugin.parallel = parallelize.NewParallelizer(parallelize.DefaultParallelism)
			pod, _ := f.seatPod(class1x, 1)
			infos := nodeInfos(f.nodes...)
			// PreFilter gathers the state once per pod, and the score reads
			// it: its cost is PreFilter's, not the score's.
			gathered, err := f.dra.ResourceClaims().GatherAllocatedState()
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				state := framework.NewCycleState()
				state.Write(dynamicresources.AllocatedStateKey, &dynamicresources.AllocatedStateData{State: gathered})
				if st := f.plugin.PreScore(f.ctx, state, pod, infos); !st.IsSuccess() {
					b.Fatal(st)
				}
				for _, ni := range infos {
					if _, st := f.plugin.Score(f.ctx, state, pod, ni); !st.IsSuccess() {
						b.Fatal(st)
					}
				}
			}
		})
	}
}

// BenchmarkDeviceOrder is the device order's work for one seat pod, on
// the clusters of BenchmarkScore (each node half full, so each has an
// order of its own): the order of every node, handed to the allocator
// in the DynamicResources plugin's PreFilter. The reordered slices are
// copied once per node and allocation state, then reused.
func BenchmarkDeviceOrder(b *testing.B) {
	for _, n := range []int{100, 500} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			// GPUs 1, 3, 5, 7: every pair broken, so that each node's
			// order differs from the published one.
			f := halfFull(b, n, func(seat int) int { return 2*seat + 1 })
			schedmetrics.Register()
			f.plugin.parallel = parallelize.NewParallelizer(parallelize.DefaultParallelism)
			pod, _ := f.seatPod(class1x, 1)
			listed, err := f.dra.ResourceSlices().ListWithDeviceTaintRules()
			if err != nil {
				b.Fatal(err)
			}
			state, err := f.dra.ResourceClaims().GatherAllocatedState()
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				cycle := framework.NewCycleState()
				if _, st := f.plugin.PreFilter(f.ctx, cycle, pod, nil); !st.IsSuccess() {
					b.Fatal(st)
				}
				d, err := cycle.Read(dynamicresources.DeviceOrderKey)
				if err != nil {
					b.Fatal(err)
				}
				if out := d.(dynamicresources.DeviceOrder).OrderDevices(f.ctx, state, listed); len(out) != len(listed) {
					b.Fatalf("%d slices ordered of %d", len(out), len(listed))
				}
			}
		})
	}
}

// halfFull is a fixture of n dgx-h100 nodes with four one-GPU seats
// allocated on each, in the API server: on GPU gpu(seat) of each, or
// where the allocator puts them where gpu is nil.
func halfFull(b *testing.B, n int, gpu func(seat int) int) *fixture {
	b.Helper()
	specs := make([]nodeSpec, n)
	for i := range specs {
		specs[i] = nodeSpec{fmt.Sprintf("node-%03d", i), "dgx-h100", threeProfiles}
	}
	f := newFixture(b, Args{}, specs...)
	for _, node := range f.nodes {
		for seat := range 4 {
			var pin []func(*resourceapi.DeviceRequest)
			if gpu != nil {
				pin = append(pin, schedulertest.WithSelector(fmt.Sprintf(`device.attributes["gpu.kyb.ai"].gpuIndices == "%d"`, gpu(seat))))
			}
			claim := schedulertest.Claim(fmt.Sprintf("%s-seat-%d", node, seat), class1x, 1, pin...)
			r, err := f.sim.Allocate(f.ctx, claim, node)
			if err != nil || r == nil {
				b.Fatalf("allocate on %s: %v", node, err)
			}
			claim.Status.Allocation = r
			f.create(claim)
		}
	}
	f.waitFor("the allocations", func() bool {
		s, err := f.dra.ResourceClaims().GatherAllocatedState()
		return err == nil && len(s.AllocatedDevices) == 4*n
	})
	return f
}
