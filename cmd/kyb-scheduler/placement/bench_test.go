package placement

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/parallelize"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// The benchmarks are the score's work for a stream of seat pods on
// clusters of dgx-h100 nodes each half full (four of eight one-GPU seats
// allocated, in the API server), as a running scheduler meets it: slices
// and classes parsed at the first pod and reused after, and from one pod
// to the next one node's allocations changed (the node the last pod went
// to). Pods alternate between two allocated states that differ by one
// seat on the first node.

// BenchmarkScore is PreScore and one Score per node, where the profile
// runs no device order (KybPlacement not at PreFilter): the score reads
// the cycle's allocations itself.
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
			states := f.stream(b)
			turn := 0
			for b.Loop() {
				state := framework.NewCycleState()
				state.Write(dynamicresources.AllocatedStateKey, &dynamicresources.AllocatedStateData{State: states[turn%2]})
				turn++
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

// BenchmarkScoreCycle is all of the score's work for one pod under
// kyb-scheduler's built-in profile: PreFilter, the device order handed to
// the allocator, PreScore over the nodes that fit and Score. Half full:
// every node has room; busy: nine nodes in ten full (all eight seats
// allocated), as the throughput study's busy clusters, the others empty;
// empty: no seat allocated but the one the stream takes and gives back,
// as the throughput study's empty nodes.
func BenchmarkScoreCycle(b *testing.B) {
	for _, c := range []struct {
		name         string
		nodes        int
		busy, unused bool
	}{{"nodes=100", 100, false, false}, {"nodes=500", 500, false, false}, {"nodes=500,busy", 500, true, false}, {"nodes=500,empty", 500, false, true}} {
		b.Run(c.name, func(b *testing.B) {
			var f *fixture
			switch {
			case c.unused:
				f = filled(b, c.nodes, func(int) int { return 0 }, nil)
			case c.busy:
				f = filled(b, c.nodes, func(node int) int { return 8 * min(1, node%10) }, nil)
			default:
				// GPUs 1, 3, 5, 7: every pair broken, so that each node's
				// order differs from the published one.
				f = halfFull(b, c.nodes, func(seat int) int { return 2*seat + 1 })
			}
			schedmetrics.Register()
			f.plugin.parallel = parallelize.NewParallelizer(parallelize.DefaultParallelism)
			pod, claim := f.seatPod(class1x, 1)
			// Filter's nodes: the ones with room.
			infos := nodeInfos(f.feasible(claim)...)
			listed, err := f.dra.ResourceSlices().ListWithDeviceTaintRules()
			if err != nil {
				b.Fatal(err)
			}
			states := f.stream(b)
			turn := 0
			for b.Loop() {
				cycle := framework.NewCycleState()
				gathered := states[turn%2]
				turn++
				cycle.Write(dynamicresources.AllocatedStateKey, &dynamicresources.AllocatedStateData{State: gathered})
				if _, st := f.plugin.PreFilter(f.ctx, cycle, pod, nil); !st.IsSuccess() {
					b.Fatal(st)
				}
				d, err := cycle.Read(dynamicresources.DeviceOrderKey)
				if err != nil {
					b.Fatal(err)
				}
				if out := d.(dynamicresources.DeviceOrder).OrderDevices(f.ctx, gathered, listed); len(out) != len(listed) {
					b.Fatalf("%d slices ordered of %d", len(out), len(listed))
				}
				if st := f.plugin.PreScore(f.ctx, cycle, pod, infos); !st.IsSuccess() {
					b.Fatal(st)
				}
				for _, ni := range infos {
					if _, st := f.plugin.Score(f.ctx, cycle, pod, ni); !st.IsSuccess() {
						b.Fatal(st)
					}
				}
			}
		})
	}
}

// stream returns the two allocated states the benchmarks' pods alternate
// between: the cluster's, and the cluster's with one more seat taken on
// the first node.
func (f *fixture) stream(b *testing.B) [2]*structured.AllocatedState {
	b.Helper()
	listed, gathered := f.snapshot()
	next := *gathered
	next.AllocatedDevices = gathered.AllocatedDevices.Clone()
	p := f.plugin.pools.update(f.ctx, listed).pool(f.nodes[0])
	for _, d := range p.devices {
		if d.size == 1 && !next.AllocatedDevices.Has(d.id) {
			next.AllocatedDevices.Insert(d.id)
			return [2]*structured.AllocatedState{gathered, &next}
		}
	}
	b.Fatalf("no free seat on %s", f.nodes[0])
	return [2]*structured.AllocatedState{}
}

// halfFull is a fixture of n dgx-h100 nodes with four one-GPU seats
// allocated on each, in the API server: on GPU gpu(seat) of each, or
// where the allocator puts them where gpu is nil.
func halfFull(b *testing.B, n int, gpu func(seat int) int) *fixture {
	b.Helper()
	return filled(b, n, func(int) int { return 4 }, gpu)
}

// filled is a fixture of n dgx-h100 nodes with seats(node) one-GPU seats
// allocated on each, in the API server, placed as halfFull's.
func filled(b *testing.B, n int, seats func(node int) int, gpu func(seat int) int) *fixture {
	b.Helper()
	specs := make([]nodeSpec, n)
	for i := range specs {
		specs[i] = nodeSpec{fmt.Sprintf("node-%03d", i), "dgx-h100", threeProfiles}
	}
	f := newFixture(b, Args{}, specs...)
	total := 0
	for i, node := range f.nodes {
		for seat := range seats(i) {
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
			total++
		}
	}
	f.waitFor("the allocations", func() bool {
		s, err := f.dra.ResourceClaims().GatherAllocatedState()
		return err == nil && len(s.AllocatedDevices) == total
	})
	return f
}
