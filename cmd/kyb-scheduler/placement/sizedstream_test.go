package placement

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// The sized stream: how much GPU memory a stream of sized seats of mixed
// sizes leaves unusable, placed by first fit (what the allocator does
// alone: the first node, in name order, and on it the first group in the
// published order, that has room), by a node drawn at random among those
// that fit (the placement study's model of kube-scheduler, which has no
// DRA score), and by kyb-scheduler under pack and spread (its device
// order and score, over the real allocator). Requests arrive at random
// (Poisson), hold their seat for a random time (exponential), and are
// dropped where they fit nowhere; the arrival rate sets the offered load,
// the share of the cluster's GPU memory the stream would hold were
// nothing dropped.
//
// Unusable memory is the fragmentation measure of Weng et al. (ATC '23,
// "Beware of Fragmentation"), over the stream's own mix: a group's free
// memory counts as unusable for each size of the mix that the group
// cannot take (too little memory or compute left, or no seat), weighted
// by the size's share of the stream. It is integrated over time and given
// as a share of the cluster's GPU memory.

// streamConfig is the sized profile alone: each GPU one group of 8 sized
// seats, the default rules (memory in steps of 1 GiB, compute of 1 %).
const streamConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  sharing: {strategy: mps, sized: true}
`

// streamSize is one size of the stream's mix, on the default step so
// that a claim consumes what it asks.
type streamSize struct {
	memory, compute string
	share           float64
}

// streamMix is the stream's sizes: memory from 4 to 40 GiB, compute in
// proportion to an H100's memory (so that memory, not compute, fills a
// group first), small sizes more frequent than large ones.
var streamMix = []streamSize{
	{"4Gi", "5", 0.20},
	{"8Gi", "10", 0.25},
	{"16Gi", "20", 0.25},
	{"24Gi", "30", 0.15},
	{"40Gi", "50", 0.15},
}

// streamPolicy places one request.
type streamPolicy string

const (
	firstFitPolicy   streamPolicy = "first-fit"
	randomNodePolicy streamPolicy = "random-node"
	kybPackPolicy    streamPolicy = "kyb-pack"
	kybSpreadPolicy  streamPolicy = "kyb-spread"
)

// streamOptions size a stream.
type streamOptions struct {
	nodes, requests int
	// load is the offered load, a share of the cluster's GPU memory.
	load float64
	// warmup is the share of requests before the measurement starts.
	warmup float64
	seed   uint64
}

// streamResult is a stream's figures over the measured span.
type streamResult struct {
	// offered, memoryUsed and unusable are time-weighted shares of the
	// cluster's GPU memory: what the stream asked for (its requests'
	// memory over their durations, as drawn), what seats held, and what
	// was free but unusable by the mix.
	offered, memoryUsed, unusable float64
	// rejected is the share of measured requests that fit nowhere.
	rejected           float64
	placed, rejections int
	// perRequest is the mean wall time to place or reject one request.
	perRequest time.Duration
}

// streamGroup is one sized group of the cluster, as the stream's mirror
// counts it: what it publishes, and what the seats on it hold.
type streamGroup struct {
	memory, compute, seats  int64
	usedMemory, usedCompute int64
	usedSeats               int64
}

func (g *streamGroup) fits(memory, compute int64) bool {
	return g.usedSeats < g.seats && g.usedMemory+memory <= g.memory && g.usedCompute+compute <= g.compute
}

// streamMirror is the cluster's sized groups, by "pool/device".
type streamMirror struct {
	groups map[string]*streamGroup
	total  int64
	sizes  [][2]int64
	shares []float64
}

func newStreamMirror(tb testing.TB, slices []*resourceapi.ResourceSlice) *streamMirror {
	tb.Helper()
	m := &streamMirror{groups: map[string]*streamGroup{}}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			sizes, ok := draresources.DeviceSizes(d)
			if !ok {
				continue
			}
			m.groups[s.Spec.Pool.Name+"/"+d.Name] = &streamGroup{memory: sizes.Memory.Capacity, compute: sizes.Compute.Capacity, seats: sizes.Seats}
			m.total += sizes.Memory.Capacity
		}
	}
	for _, sz := range streamMix {
		memory, compute := resource.MustParse(sz.memory), resource.MustParse(sz.compute)
		m.sizes = append(m.sizes, [2]int64{memory.Value(), compute.Value()})
		m.shares = append(m.shares, sz.share)
	}
	if len(m.groups) == 0 {
		tb.Fatal("the cluster publishes no sized group")
	}
	return m
}

// hold counts r's share on its group, and checks that the allocator took
// exactly the size asked, and never more than the group has.
func (m *streamMirror) hold(tb testing.TB, r *resourceapi.AllocationResult, memory, compute int64, sign int64) {
	tb.Helper()
	if len(r.Devices.Results) != 1 {
		tb.Fatalf("a sized claim got %d devices", len(r.Devices.Results))
	}
	res := r.Devices.Results[0]
	g, ok := m.groups[res.Pool+"/"+res.Device]
	if !ok {
		tb.Fatalf("a sized claim got %s/%s, no sized group", res.Pool, res.Device)
	}
	took := res.ConsumedCapacity
	tookMemory, tookCompute := took[draresources.MemoryCapacity], took[draresources.ComputeCapacity]
	if tookMemory.CmpInt64(memory) != 0 || tookCompute.CmpInt64(compute) != 0 {
		tb.Fatalf("a claim of %d bytes and %d %% consumed %v", memory, compute, took)
	}
	g.usedMemory += sign * memory
	g.usedCompute += sign * compute
	g.usedSeats += sign
	if g.usedMemory > g.memory || g.usedCompute > g.compute || g.usedSeats > g.seats || g.usedSeats < 0 {
		tb.Fatalf("%s/%s holds %d of %d bytes, %d of %d %%, %d of %d seats", res.Pool, res.Device, g.usedMemory, g.memory, g.usedCompute, g.compute, g.usedSeats, g.seats)
	}
}

// used and unusable are the memory held, and the free memory the mix
// cannot use (weighted by its shares), now.
func (m *streamMirror) used() int64 {
	var n int64
	for _, g := range m.groups {
		n += g.usedMemory
	}
	return n
}

func (m *streamMirror) unusable() float64 {
	var u float64
	for _, g := range m.groups {
		free := float64(g.memory - g.usedMemory)
		for i, sz := range m.sizes {
			if !g.fits(sz[0], sz[1]) {
				u += m.shares[i] * free
			}
		}
	}
	return u
}

type streamRequest struct {
	arrival, duration float64
	size              int
}

// streamRequests draws a stream for a cluster of total bytes of memory.
func streamRequests(opts streamOptions, total int64, sizes [][2]int64) []streamRequest {
	rng := rand.New(rand.NewPCG(opts.seed, 0x5eed))
	var mean float64
	for i, sz := range streamMix {
		mean += sz.share * float64(sizes[i][0])
	}
	// Mean duration 1: the rate at which the mean request's memory,
	// held for 1, offers load times the cluster's memory.
	rate := opts.load * float64(total) / mean
	var out []streamRequest
	t := 0.0
	for range opts.requests {
		t += rng.ExpFloat64() / rate
		x, k := rng.Float64(), 0
		for k < len(streamMix)-1 && x >= streamMix[k].share {
			x -= streamMix[k].share
			k++
		}
		out = append(out, streamRequest{arrival: t, duration: rng.ExpFloat64(), size: k})
	}
	return out
}

type streamRelease struct {
	end  float64
	r    *resourceapi.AllocationResult
	size int
}

type streamReleases []streamRelease

func (h streamReleases) Len() int           { return len(h) }
func (h streamReleases) Less(i, j int) bool { return h[i].end < h[j].end }
func (h streamReleases) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *streamReleases) Push(x any)        { *h = append(*h, x.(streamRelease)) }
func (h *streamReleases) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// runSizedStream places a stream on a fresh cluster of dgx-h100 nodes.
func runSizedStream(tb testing.TB, policy streamPolicy, opts streamOptions) streamResult {
	tb.Helper()
	specs := make([]nodeSpec, opts.nodes)
	for i := range specs {
		specs[i] = nodeSpec{fmt.Sprintf("node-%02d", i), "dgx-h100", streamConfig}
	}
	f := newFixture(tb, Args{DefaultPolicy: Pack}, specs...)
	m := newStreamMirror(tb, f.sim.Slices())
	reqs := streamRequests(opts, m.total, m.sizes)
	// Every request's pod and claim. kyb-scheduler's score reads a pod's
	// claims from the scheduler's cache: they are created in the API
	// server a batch ahead of the stream, no more at once than the fake
	// API server's watch buffers (100 events) hold before the informer
	// reads them. The allocations are the allocator's state alone.
	pods := make([]*v1.Pod, len(reqs))
	claims := make([]*resourceapi.ResourceClaim, len(reqs))
	kyb := policy == kybPackPolicy || policy == kybSpreadPolicy
	for i, rq := range reqs {
		sz := streamMix[rq.size]
		if !kyb {
			claims[i] = schedulertest.Claim(fmt.Sprintf("claim-%d", i), classSized, 1, sized(sz.memory, sz.compute))
			continue
		}
		pods[i], claims[i] = f.seatPodObjects(classSized, 1, sized(sz.memory, sz.compute))
		pods[i].Annotations = map[string]string{PolicyAnnotation: string(Pack)}
		if policy == kybSpreadPolicy {
			pods[i].Annotations[PolicyAnnotation] = string(Spread)
		}
	}
	const ahead = 50
	created := 0
	createUpTo := func(i int) {
		if !kyb || i < created {
			return
		}
		for ; created < min(i+ahead, len(claims)); created++ {
			f.create(claims[created])
		}
		for _, c := range claims[i:created] {
			f.waitForClaim(c)
		}
	}
	pick := rand.New(rand.NewPCG(opts.seed, 0x91c4))
	start, end := reqs[int(float64(len(reqs))*opts.warmup)].arrival, reqs[len(reqs)-1].arrival

	var res streamResult
	var running streamReleases
	var usedInt, unusableInt, now float64
	advance := func(to float64) {
		for {
			next := to
			if len(running) > 0 && running[0].end < to {
				next = running[0].end
			}
			if lo, hi := max(now, start), min(next, end); hi > lo {
				usedInt += float64(m.used()) * (hi - lo)
				unusableInt += m.unusable() * (hi - lo)
			}
			now = next
			if len(running) == 0 || running[0].end > to {
				return
			}
			rel := heap.Pop(&running).(streamRelease)
			f.sim.Release(rel.r)
			m.hold(tb, rel.r, m.sizes[rel.size][0], m.sizes[rel.size][1], -1)
		}
	}
	var took time.Duration
	for i, rq := range reqs {
		advance(rq.arrival)
		createUpTo(i)
		t0 := time.Now()
		r := f.placeSized(policy, pods[i], claims[i], pick)
		took += time.Since(t0)
		measured := rq.arrival >= start
		if r == nil {
			if measured {
				res.rejections++
			}
			continue
		}
		m.hold(tb, r, m.sizes[rq.size][0], m.sizes[rq.size][1], 1)
		heap.Push(&running, streamRelease{end: rq.arrival + rq.duration, r: r, size: rq.size})
		if measured {
			res.placed++
		}
	}
	advance(end)
	var offered float64
	for _, rq := range reqs {
		if lo, hi := max(rq.arrival, start), min(rq.arrival+rq.duration, end); hi > lo {
			offered += float64(m.sizes[rq.size][0]) * (hi - lo)
		}
	}
	span := (end - start) * float64(m.total)
	res.offered = offered / span
	res.memoryUsed, res.unusable = usedInt/span, unusableInt/span
	res.rejected = float64(res.rejections) / float64(max(res.placed+res.rejections, 1))
	res.perRequest = took / time.Duration(len(reqs))
	return res
}

// placeSized places pod's claim under policy and records it in the
// allocated state: nil where it fits nowhere.
func (f *fixture) placeSized(policy streamPolicy, pod *v1.Pod, claim *resourceapi.ResourceClaim, pick *rand.Rand) *resourceapi.AllocationResult {
	f.t.Helper()
	kyb := policy == kybPackPolicy || policy == kybSpreadPolicy
	state := framework.NewCycleState()
	var a structured.Allocator
	if kyb {
		a = f.cycleAllocator(state, pod)
	} else {
		var err error
		if a, err = f.sim.Allocator(f.ctx); err != nil {
			f.t.Fatal(err)
		}
	}
	fits := map[string]*resourceapi.AllocationResult{}
	var nodes []string
	for _, node := range f.nodes {
		if r := f.tryWith(a, claim, node); r != nil {
			fits[node] = r
			nodes = append(nodes, node)
			if policy == firstFitPolicy {
				break
			}
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	node := nodes[pick.IntN(len(nodes))]
	if kyb {
		scores, st := f.scoresIn(state, pod, nodes)
		if scores == nil {
			f.t.Fatalf("PreScore %s: %v", pod.Name, st)
		}
		node = best(nodes, scores, pick.IntN(len(nodes)))
	}
	f.sim.Record(fits[node])
	return fits[node]
}

// The unusable memory of a group is its free memory for each size of the
// mix it cannot take, weighted by the size's share.
func TestUnusableMemoryCountsWhatTheMixCannotTake(t *testing.T) {
	gi := int64(1 << 30)
	m := &streamMirror{
		groups: map[string]*streamGroup{
			// 10 GiB and 40 % left: the 4 and 8 GiB sizes fit.
			"a": {memory: 80 * gi, compute: 100, seats: 8, usedMemory: 70 * gi, usedCompute: 60, usedSeats: 3},
			// Memory enough for all but no seat left: every size refused.
			"b": {memory: 80 * gi, compute: 100, seats: 8, usedMemory: 32 * gi, usedCompute: 40, usedSeats: 8},
			// Empty: every size fits.
			"c": {memory: 80 * gi, compute: 100, seats: 8},
		},
		sizes:  [][2]int64{{4 * gi, 5}, {8 * gi, 10}, {16 * gi, 20}, {24 * gi, 30}, {40 * gi, 50}},
		shares: []float64{0.20, 0.25, 0.25, 0.15, 0.15},
	}
	want := (0.25+0.15+0.15)*float64(10*gi) + 1.0*float64(48*gi)
	if got := m.unusable(); math.Abs(got-want) > 1 {
		t.Errorf("unusable %.0f bytes, want %.0f", got, want)
	}
	if got := m.used(); got != 102*gi {
		t.Errorf("used %d bytes, want %d", got, 102*gi)
	}
}

// A short stream through each policy: every claim consumes the size it
// asked, no group holds more than it publishes (the mirror checks both),
// and the figures are shares.
func TestSizedStreamHoldsWhatItAsked(t *testing.T) {
	for _, p := range []streamPolicy{firstFitPolicy, randomNodePolicy, kybPackPolicy, kybSpreadPolicy} {
		t.Run(string(p), func(t *testing.T) {
			r := runSizedStream(t, p, streamOptions{nodes: 2, requests: 200, load: 2, warmup: 0.1, seed: 1})
			if r.placed == 0 || r.rejections == 0 {
				t.Errorf("%d placed, %d rejected: the stream neither fills the cluster nor places", r.placed, r.rejections)
			}
			for name, v := range map[string]float64{"memory used": r.memoryUsed, "unusable": r.unusable, "rejected": r.rejected} {
				if v <= 0 || v >= 1 {
					t.Errorf("%s %.3f, want a share strictly between 0 and 1", name, v)
				}
			}
			if r.memoryUsed+r.unusable > 1 {
				t.Errorf("memory used %.3f and unusable %.3f add up to more than the cluster's", r.memoryUsed, r.unusable)
			}
		})
	}
}

// BenchmarkSizedStream is the sized stream at 90 % offered load on eight
// dgx-h100 nodes (64 groups), 2,000 requests of which the first 10 % warm
// the cluster up, under each policy, seeds 1 to 3. It reports the
// unusable memory, the memory held and the requests rejected, each in
// per cent, and the wall time to place one request. Run with
// -benchtime=1x: a stream is deterministic for its seed.
func BenchmarkSizedStream(b *testing.B) {
	for _, seed := range []uint64{1, 2, 3} {
		for _, p := range []streamPolicy{firstFitPolicy, randomNodePolicy, kybPackPolicy, kybSpreadPolicy} {
			b.Run(fmt.Sprintf("seed=%d/policy=%s", seed, p), func(b *testing.B) {
				var r streamResult
				for b.Loop() {
					r = runSizedStream(b, p, streamOptions{nodes: 8, requests: 3000, load: 0.9, warmup: 0.3, seed: seed})
				}
				b.ReportMetric(100*r.unusable, "unusable-%")
				b.ReportMetric(100*r.offered, "offered-%")
				b.ReportMetric(100*r.memoryUsed, "memory-used-%")
				b.ReportMetric(100*r.rejected, "rejected-%")
				b.ReportMetric(float64(r.perRequest.Microseconds())/1e3, "ms/request")
			})
		}
	}
}
