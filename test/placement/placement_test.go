package placement

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"math"
	"slices"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

var ctx = context.Background()

func cluster(t *testing.T, spec string) []*Node {
	t.Helper()
	specs, err := ParseNodes(spec)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := NewCluster(ctx, specs, []int{1, 2, 4})
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

func mustTake(t *testing.T, n *Node, gpus ...int) {
	t.Helper()
	if err := n.take(gpus); err != nil {
		t.Fatal(err)
	}
}

func place(t *testing.T, p Policy, size int) *Placement {
	t.Helper()
	pl, err := p.Place(ctx, Request{Size: size})
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// Three nodes: a has 6 free GPUs, b 2, c 8.
func TestClassicPoliciesChooseTheNodeTheirRuleSays(t *testing.T) {
	for _, tc := range []struct{ policy, node string }{
		{"first-fit", "pcie-8gpu-0"}, {"best-fit", "pcie-8gpu-1"}, {"worst-fit", "pcie-8gpu-2"},
		{"bin-packing", "pcie-8gpu-1"}, {"spread", "pcie-8gpu-2"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			nodes := cluster(t, "pcie-8gpu:3")
			mustTake(t, nodes[0], 0, 1)
			mustTake(t, nodes[1], 0, 1, 2, 3, 4, 5)
			p, err := NewClassic(tc.policy, nodes, 0.1)
			if err != nil {
				t.Fatal(err)
			}
			pl := place(t, p, 2)
			if pl == nil || pl.Node.Name != tc.node {
				t.Fatalf("placed on %v, want %s", pl, tc.node)
			}
			if tc.policy == "first-fit" && !slices.Equal(pl.GPUs, []int{2, 3}) {
				t.Errorf("first-fit took GPUs %v, want the lowest free ones, 2 and 3", pl.GPUs)
			}
		})
	}
}

func TestClassicGPUChoiceCanSplitAGroupAndIsCountedSo(t *testing.T) {
	nodes := cluster(t, "nvlink-2x4:1")
	mustTake(t, nodes[0], 0, 1, 2)
	p, _ := NewClassic("first-fit", nodes, 0)
	pl := place(t, p, 2)
	if pl == nil || !slices.Equal(pl.GPUs, []int{3, 4}) || pl.Aligned {
		t.Fatalf("first-fit on GPUs 3,4 (across the two NVLink islands) must be counted as split: %+v", pl)
	}
}

func TestTopologyAwareKeepsIntactGroupsWhole(t *testing.T) {
	nodes := cluster(t, "nvlink-2x4:2")
	// Node 0: island 0-3 broken by GPU 0; node 1 empty. A 1x seat belongs
	// next to GPU 0, where no whole island is left to break.
	mustTake(t, nodes[0], 0)
	p, _ := NewClassic("topology-aware", nodes, 0)
	pl := place(t, p, 1)
	if pl == nil || pl.Node != nodes[0] || !slices.Contains([]int{1, 2, 3}, pl.GPUs[0]) {
		t.Fatalf("1x seat: %+v, want GPU 1, 2 or 3 of node 0", pl)
	}
	mustTake(t, nodes[0], pl.GPUs...)
	// No free 4-GPU group fits across islands: a 4x request goes to the
	// other island of node 0 (fewest free GPUs), never across.
	pl = place(t, p, 4)
	if pl == nil || pl.Node != nodes[0] || !slices.Equal(pl.GPUs, []int{4, 5, 6, 7}) || !pl.Aligned {
		t.Fatalf("4x seat: %+v, want GPUs 4-7 of node 0", pl)
	}
}

func TestGeneratorIsSeededAndFollowsTheMix(t *testing.T) {
	mix, err := ParseMix("1x:0.6,2x:0.3,4x:0.1")
	if err != nil {
		t.Fatal(err)
	}
	w := Workload{Seed: 42, Requests: 20000, Mix: mix, Arrival: "exp", Duration: "pareto", MeanDuration: 1, Load: 0.8}
	a, _ := w.Generate(64)
	b, _ := w.Generate(64)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed gave two streams")
	}
	w.Seed = 43
	if c, _ := w.Generate(64); slices.Equal(a, c) {
		t.Fatal("another seed gave the same stream")
	}
	count := map[int]int{}
	work := 0.0
	for i, r := range a {
		count[r.Size]++
		work += float64(r.Size) * r.Duration
		if i > 0 && r.Arrival < a[i-1].Arrival {
			t.Fatal("arrivals out of order")
		}
	}
	for k, want := range mix {
		if got := float64(count[k]) / float64(len(a)); math.Abs(got-want) > 0.02 {
			t.Errorf("size %d: share %.3f, want %.2f", k, got, want)
		}
	}
	// Offered load: GPU-time asked for over GPU-time available.
	if load := work / (a[len(a)-1].Arrival * 64); math.Abs(load-0.8) > 0.12 {
		t.Errorf("offered load %.2f, want about 0.8", load)
	}
	if _, err := ParseMix("3x:1"); err == nil {
		t.Error("a 3x request size was accepted")
	}
	if _, err := (Workload{Requests: 1, Mix: mix, Arrival: "gauss", Duration: "exp", MeanDuration: 1, Load: 1, Seed: 1}).Generate(8); err == nil {
		t.Error("an unknown distribution was accepted")
	}
}

// A hand-checked trace on one 8-GPU node: a 4x job over [0, 2), a 2x job
// over [1, 3), a 4x at 1.5 that fits nowhere (6 of 8 GPUs busy), and a last
// arrival at 4 that ends the measurement.
func TestMetricsOfAHandCheckedTrace(t *testing.T) {
	nodes := cluster(t, "dgx-h100:1")
	p, _ := NewClassic("topology-aware", nodes, 0)
	reqs := []Request{{0, 4, 0, 2}, {1, 2, 1, 2}, {2, 4, 1.5, 1}, {3, 1, 4, 1}}
	r, err := Simulate(ctx, p, nodes, reqs, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Busy GPU-time: 4*2 + 2*2 = 12 over 8 GPUs * 4 = 32.
	if math.Abs(r.Utilization-12.0/32) > 1e-9 {
		t.Errorf("utilization %v, want %v", r.Utilization, 12.0/32)
	}
	if r.Rejected != 1 || r.Placed != 3 || math.Abs(r.Rejection-0.25) > 1e-9 {
		t.Errorf("placed %d, rejected %d (%v), want 3, 1 (0.25)", r.Placed, r.Rejected, r.Rejection)
	}
	// Fragmentation: [0,1) 4 free in a whole 4-group: 0; [1,2) 2 free, in
	// no whole 4-group: 1; [2,3) 6 free, 4 of them whole: 2/6; [3,4) 0.
	want := (0 + 1 + 2.0/6 + 0) / 4
	if math.Abs(r.Fragmentation-want) > 1e-9 {
		t.Errorf("fragmentation %v, want %v", r.Fragmentation, want)
	}
}

// A reject made while the cluster had as many GPUs free as asked is
// counted apart: there only the shape of what was free stood in the way.
// On one 8-GPU node under topology-aware, three 2x jobs take GPUs 0-1,
// 2-3 and 4-5; once the second ends, GPUs 2, 3, 6 and 7 are free and no
// four-GPU group is: a 4x at 1.5 is rejected with four GPUs free. In the
// hand-checked trace above, the 4x meets two free GPUs. Both streams ask
// for 11 GPUs and have 4 rejected.
func TestRejectsAndTheirGPUsAreCounted(t *testing.T) {
	for _, tc := range []struct {
		name                              string
		reqs                              []Request
		rejected, rejectedLarge, admitted int
		rejectedFree                      int
		requestedGPUs, rejectedGPUs       int
	}{
		{name: "four GPUs free, no group", reqs: []Request{{0, 2, 0, 3}, {1, 2, 0.1, 1}, {2, 2, 0.2, 3}, {3, 4, 1.5, 1}, {4, 1, 4, 1}},
			rejected: 1, rejectedLarge: 1, rejectedFree: 1, requestedGPUs: 11, rejectedGPUs: 4},
		{name: "two GPUs free", reqs: []Request{{0, 4, 0, 2}, {1, 2, 1, 2}, {2, 4, 1.5, 1}, {3, 1, 4, 1}},
			rejected: 1, rejectedLarge: 1, admitted: 1, requestedGPUs: 11, rejectedGPUs: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := cluster(t, "dgx-h100:1")
			p, _ := NewClassic("topology-aware", nodes, 0)
			r, err := Simulate(ctx, p, nodes, tc.reqs, 0)
			if err != nil {
				t.Fatal(err)
			}
			if r.Rejected != tc.rejected || r.RejectedLarge != tc.rejectedLarge || r.AdmittedLarge != tc.admitted || r.RejectedFree != tc.rejectedFree {
				t.Errorf("rejected %d (4x+ %d, with the GPUs free %d), 4x+ admitted %d; want %d (%d, %d), %d",
					r.Rejected, r.RejectedLarge, r.RejectedFree, r.AdmittedLarge, tc.rejected, tc.rejectedLarge, tc.rejectedFree, tc.admitted)
			}
			if r.RequestedGPUs != tc.requestedGPUs || r.RejectedGPUs != tc.rejectedGPUs {
				t.Errorf("%d GPUs rejected of %d asked, want %d of %d", r.RejectedGPUs, r.RequestedGPUs, tc.rejectedGPUs, tc.requestedGPUs)
			}
		})
	}
}

func TestDRAPoliciesNeverDoubleBookAGPU(t *testing.T) {
	mix, _ := ParseMix("1x:0.5,2x:0.3,4x:0.2")
	for _, order := range []v1alpha1.AllocationPolicy{v1alpha1.PolicyPack, v1alpha1.PolicySpread} {
		nodes := cluster(t, "dgx-h100:1,nvlink-2x4:1")
		reqs, err := Workload{Seed: 3, Requests: 400, Mix: mix, Arrival: "exp", Duration: "exp", MeanDuration: 1, Load: 1.5}.Generate(16)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewDRA(order, nodes, 3)
		if err != nil {
			t.Fatal(err)
		}
		// Simulate fails if a placement takes a GPU already taken.
		r, err := Simulate(ctx, p, nodes, reqs, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.Placed == 0 || r.Rejected == 0 || r.Misaligned != 0 {
			t.Errorf("%s: %+v: want placements, rejections under overload, and none split", order, r)
		}
	}
}

func TestPlotIsWellFormedSVG(t *testing.T) {
	var buf bytes.Buffer
	st := &Study{GPUs: 8, Results: []Result{{Policy: "a", Utilization: 0.5}, {Policy: "b<c", Rejection: 0.1}}}
	st.SVG(&buf)
	d := xml.NewDecoder(&buf)
	rects := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v\n%s", err, buf.String())
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	if rects != 2*3+3 {
		t.Errorf("%d bars and legend boxes, want 9", rects)
	}
}
