package bench

import (
	"context"
	"fmt"
	"time"

	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// AllocOptions size the allocator study.
type AllocOptions struct {
	// RejectNodes full nodes are each rejected once per allocator.
	RejectNodes int
	// FirstFitNodes and FirstFitClaims size the first-fit run (M2).
	FirstFitNodes, FirstFitClaims int
	// Preset and Config are our node.
	Preset, Config string
}

// Allocator goals, as ratios to the basic shape.
const (
	RejectGoal   = 5.0 // reject a full node in at most 5x basic's time
	ClaimsGoal   = 0.4 // place at least 0.4x basic's claims per second
	LongTermGoal = 0.8
)

// AllocStudy is the allocator study's rounds.
type AllocStudy struct {
	Options AllocOptions
	// Shapes are basic first, then ours.
	Shapes []string
	// Reject and FirstFit per round, per shape.
	Reject   [][]time.Duration
	FirstFit [][]FirstFitResult
	// Skip are the estimates of an upstream change: reject times of our
	// node with what such a change would skip left out of the slice.
	SkipNames []string
	Skip      [][]time.Duration
	// PerNode is how many claims one node of each shape holds.
	PerNode []int
}

// RunAlloc measures the basic shape and ours, interleaved, rounds times.
func RunAlloc(ctx context.Context, opts AllocOptions, rounds int) (*AllocStudy, error) {
	basic := BasicShape()
	ours, err := KybShape(ctx, "ours ("+opts.Preset+", demo config)", opts.Preset, opts.Config, "1x")
	if err != nil {
		return nil, err
	}
	// What skipping before CEL would leave: the full node without its
	// exhausted 1x groups (upstream skips exhausted shared devices), and
	// without anything it cannot allocate (also devices whose counters are
	// used up). A 1x claim is rejected on both at once.
	noExhausted := withoutDevices(ours, "ours, exhausted groups left out", func(name string) bool { return hasSuffix(name, "-1x") })
	noneLeft := withoutDevices(ours, "ours, every unallocatable device left out", func(string) bool { return true })
	st := &AllocStudy{Options: opts, Shapes: []string{basic.Name, ours.Name}, SkipNames: []string{noExhausted.Name, noneLeft.Name},
		PerNode: []int{basic.PerNode, ours.PerNode}}
	for r := 0; r < rounds; r++ {
		var rej []time.Duration
		var ff []FirstFitResult
		for _, s := range []Shape{basic, ours} {
			d, err := RejectFull(ctx, s, opts.RejectNodes, 5)
			if err != nil {
				return nil, err
			}
			res, err := FirstFit(ctx, s, opts.FirstFitNodes, opts.FirstFitClaims)
			if err != nil {
				return nil, err
			}
			rej, ff = append(rej, d), append(ff, res)
		}
		var skip []time.Duration
		for _, s := range []Shape{noExhausted, noneLeft} {
			d, err := RejectEmpty(ctx, s, opts.RejectNodes, 5)
			if err != nil {
				return nil, err
			}
			skip = append(skip, d)
		}
		st.Reject, st.FirstFit, st.Skip = append(st.Reject, rej), append(st.FirstFit, ff), append(st.Skip, skip)
	}
	return st, nil
}

func hasSuffix(s, suffix string) bool {
	return len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix
}

// withoutDevices is s with the devices drop names left out of every
// slice, and no claim of its class fitting anywhere.
func withoutDevices(s Shape, name string, drop func(device string) bool) Shape {
	out := s
	out.Name = name
	out.PerNode = 0
	out.Resources = func(node string) resourceslice.DriverResources {
		res := s.Resources(node)
		for pn, pool := range res.Pools {
			for i, sl := range pool.Slices {
				kept := sl.Devices[:0:0]
				for _, d := range sl.Devices {
					if !drop(d.Name) {
						kept = append(kept, d)
					}
				}
				pool.Slices[i].Devices = kept
			}
			res.Pools[pn] = pool
		}
		return res
	}
	return out
}

// Tables are the study's results.
func (st *AllocStudy) Tables() []*Table {
	rounds := len(st.Reject)
	t := &Table{
		Title: fmt.Sprintf("Scheduler allocator: our shape against upstream's basic shape (median of %d rounds)", rounds),
		Header: []string{"shape", "reject a full node", "ratio to basic", "goal ≤ 5x", "first-fit claims/s", "ratio to basic", "goal ≥ 0.4x",
			"Allocate calls"},
	}
	for i, name := range st.Shapes {
		var rej []time.Duration
		var rejRatio, cps, cpsRatio []float64
		calls := 0
		for r := 0; r < rounds; r++ {
			rej = append(rej, st.Reject[r][i])
			rejRatio = append(rejRatio, float64(st.Reject[r][i])/float64(st.Reject[r][0]))
			cps = append(cps, st.FirstFit[r][i].ClaimsPerSecond())
			cpsRatio = append(cpsRatio, st.FirstFit[r][i].ClaimsPerSecond()/st.FirstFit[r][0].ClaimsPerSecond())
			calls = st.FirstFit[r][i].Calls
		}
		rr, cr := Median(rejRatio), Median(cpsRatio)
		row := []string{name, Dur(MedianDuration(rej)), Ratio(rr), "", fmt.Sprintf("%.0f", Median(cps)), Ratio(cr), "", fmt.Sprint(calls)}
		if i > 0 {
			row[3], row[6] = Verdict(rr <= RejectGoal), Verdict(cr >= ClaimsGoal)
		}
		t.Rows = append(t.Rows, row)
	}
	t.Notes = []string{fmt.Sprintf("Reject: a one-device claim against %d full nodes, each once per allocator as kube-scheduler's Filter does. "+
		"First fit: %d one-device claims over %d nodes, a fresh allocator per claim, Allocate node by node until it fits (M2 of allocator-cost.md). "+
		"A node holds %d basic claims, %d of ours (one-GPU seats).", st.Options.RejectNodes, st.Options.FirstFitClaims, st.Options.FirstFitNodes, st.PerNode[0], st.PerNode[1])}

	p := &Table{
		Title:  "Upstream allocator change, estimated: our full node with what the change would skip left out of the slice",
		Header: []string{"variant", "reject a full node", "ratio to basic", "est. first-fit claims/s ratio to basic"},
	}
	for j, name := range st.SkipNames {
		var rej []time.Duration
		var rr, est []float64
		for r := 0; r < rounds; r++ {
			rej = append(rej, st.Skip[r][j])
			rr = append(rr, float64(st.Skip[r][j])/float64(st.Reject[r][0]))
			est = append(est, st.estimate(r, st.Skip[r][j])/st.FirstFit[r][0].ClaimsPerSecond())
		}
		p.Rows = append(p.Rows, []string{name, Dur(MedianDuration(rej)), Ratio(Median(rr)), Ratio(Median(est))})
	}
	p.Notes = []string{"Estimate: our first-fit run's time with each full-node reject costing the variant's time instead of ours " +
		"(every Allocate call but the last of each claim rejects a full node)."}
	return []*Table{t, p}
}

// estimate is our first-fit throughput in round r had each full-node
// reject taken reject instead of what it took.
func (st *AllocStudy) estimate(r int, reject time.Duration) float64 {
	ff := st.FirstFit[r][1]
	rejects := ff.Calls - ff.Claims
	elapsed := ff.Elapsed - time.Duration(rejects)*(st.Reject[r][1]-reject)
	return float64(ff.Claims) / elapsed.Seconds()
}
