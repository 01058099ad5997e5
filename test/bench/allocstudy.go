package bench

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// AllocOptions size the allocator study.
type AllocOptions struct {
	// RejectNodes full nodes are each rejected once per allocator.
	RejectNodes int
	// FirstFitNodes and FirstFitClaims size the first-fit run (M2).
	FirstFitNodes, FirstFitClaims int
	// Preset is our node.
	Preset string
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
	// Variants are basic first, then ours, step by step.
	Variants []Variant
	// Reject and FirstFit per round, per step.
	Reject   [][]time.Duration
	FirstFit [][]FirstFitResult
	// Upstream are estimates of an allocator change: reject times of a
	// full node of ours with what the change would skip left out.
	Upstream []Upstream
	Skip     [][]time.Duration
}

// Upstream is one estimated allocator change.
type Upstream struct {
	Shape
	// Of is the index of the step whose full node it stands for.
	Of int
}

// RunAlloc measures the basic shape and every step of ours, interleaved,
// rounds times.
func RunAlloc(ctx context.Context, opts AllocOptions, rounds int) (*AllocStudy, error) {
	steps, err := Variants(ctx, opts.Preset)
	if err != nil {
		return nil, err
	}
	basic := Variant{Shape: BasicShape(), Note: "10 plain devices, 13 attributes, 2 capacities"}
	st := &AllocStudy{Options: opts, Variants: append([]Variant{basic}, steps...)}
	def, demo := st.step("lean, one-seat groups plain (default)"), st.step("consumable seats (demo config)")
	if def < 0 || demo < 0 {
		return nil, fmt.Errorf("allocator study: a step is missing")
	}
	is1x := func(name string) bool { return strings.HasSuffix(name, "-1x") }
	all := func(string) bool { return true }
	st.Upstream = []Upstream{
		{withoutDevices(st.Variants[demo].Shape, "demo config: exhausted shared devices skipped", is1x), demo},
		{withoutDevices(st.Variants[def].Shape, "default: devices without free counters skipped", all), def},
		{withoutDevices(st.Variants[demo].Shape, "demo config: both", all), demo},
	}
	for r := 0; r < rounds; r++ {
		var rej []time.Duration
		var ff []FirstFitResult
		for _, s := range st.Variants {
			d, err := RejectFull(ctx, s.Shape, opts.RejectNodes, 5)
			if err != nil {
				return nil, err
			}
			res, err := FirstFit(ctx, s.Shape, opts.FirstFitNodes, opts.FirstFitClaims)
			if err != nil {
				return nil, err
			}
			rej, ff = append(rej, d), append(ff, res)
		}
		var skip []time.Duration
		for _, u := range st.Upstream {
			d, err := RejectEmpty(ctx, u.Shape, opts.RejectNodes, 5)
			if err != nil {
				return nil, err
			}
			skip = append(skip, d)
		}
		st.Reject, st.FirstFit, st.Skip = append(st.Reject, rej), append(st.FirstFit, ff), append(st.Skip, skip)
	}
	return st, nil
}

func (st *AllocStudy) step(name string) int {
	for i, s := range st.Variants {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// Figures are the medians over rounds of one step, as ratios to basic.
type Figures struct {
	Reject, RejectRatio   float64 // µs, ratio
	ClaimsPerS, CPSRatio  float64
	PerCall               time.Duration
	Calls, PerNode        int
	ClaimTime, ClaimRatio float64 // µs per allocated claim, ratio
}

// Figures returns step i's medians.
func (st *AllocStudy) Figures(i int) Figures {
	var rej, rejRatio, cps, cpsRatio, per []float64
	f := Figures{PerNode: st.Variants[i].PerNode}
	for r := range st.Reject {
		rej = append(rej, float64(st.Reject[r][i])/1e3)
		rejRatio = append(rejRatio, float64(st.Reject[r][i])/float64(st.Reject[r][0]))
		cps = append(cps, st.FirstFit[r][i].ClaimsPerSecond())
		cpsRatio = append(cpsRatio, st.FirstFit[r][i].ClaimsPerSecond()/st.FirstFit[r][0].ClaimsPerSecond())
		per = append(per, float64(st.FirstFit[r][i].PerCall()))
		f.Calls = st.FirstFit[r][i].Calls
	}
	f.Reject, f.RejectRatio, f.ClaimsPerS, f.CPSRatio = Median(rej), Median(rejRatio), Median(cps), Median(cpsRatio)
	f.PerCall = time.Duration(Median(per))
	f.ClaimTime, f.ClaimRatio = 1e6/f.ClaimsPerS, 1/f.CPSRatio
	return f
}

// Tables are the study's results.
func (st *AllocStudy) Tables() []*Table {
	t := &Table{
		Title: fmt.Sprintf("Scheduler allocator: our node (%s) against upstream's basic shape, step by step (median of %d rounds)", st.Options.Preset, len(st.Reject)),
		Header: []string{"shape", "change", "claims/node", "reject a full node", "ratio", "goal ≤ 5x", "first-fit claims/s", "ratio", "goal ≥ 0.4x",
			"time per claim", "Allocate calls"},
	}
	for i, s := range st.Variants {
		f := st.Figures(i)
		row := []string{s.Name, s.Note, fmt.Sprint(f.PerNode), Dur(time.Duration(f.Reject * 1e3)), Ratio(f.RejectRatio), "",
			fmt.Sprintf("%.0f", f.ClaimsPerS), Ratio(f.CPSRatio), "", Dur(time.Duration(f.ClaimTime * 1e3)), fmt.Sprint(f.Calls)}
		if s.Goals {
			row[5], row[8] = Verdict(f.RejectRatio <= RejectGoal), Verdict(f.CPSRatio >= ClaimsGoal)
		}
		t.Rows = append(t.Rows, row)
	}
	t.Notes = []string{fmt.Sprintf("Reject: a one-device claim against %d full nodes, each once per allocator as kube-scheduler's Filter does. "+
		"First fit: %d one-device claims over %d nodes, a fresh allocator per claim (PreFilter), Allocate node by node until it fits (Filter). "+
		"Claims are 1x seats of ours, one plain device of basic; time per claim is the first-fit run's time divided by its claims. "+
		"Goals are judged on the product's shapes (default and consumable seats).",
		st.Options.RejectNodes, st.Options.FirstFitClaims, st.Options.FirstFitNodes)}

	p := &Table{
		Title:  "Upstream allocator change, estimated: a full node of ours with what the change would skip left out of the slice",
		Header: []string{"variant", "reject a full node", "ratio to basic", "est. first-fit claims/s ratio to basic"},
	}
	for j, u := range st.Upstream {
		var rej []time.Duration
		var rr, est []float64
		for r := range st.Reject {
			rej = append(rej, st.Skip[r][j])
			rr = append(rr, float64(st.Skip[r][j])/float64(st.Reject[r][0]))
			est = append(est, st.estimate(r, u.Of, st.Skip[r][j])/st.FirstFit[r][0].ClaimsPerSecond())
		}
		p.Rows = append(p.Rows, []string{u.Name, Dur(MedianDuration(rej)), Ratio(Median(rr)), Ratio(Median(est))})
	}
	p.Notes = []string{"Estimate: the step's first-fit run with each full-node reject (every Allocate call but the last of each claim) " +
		"scaled by the variant's reject time over the step's; the claim's last call costs the run's mean call."}
	return []*Table{t, p}
}

// estimate is step i's first-fit throughput in round r had each full-node
// reject taken reject instead of what it took. The run's Allocate calls
// are scaled, not subtracted: the mean call of the run costs what it cost,
// and a reject that much less by reject's ratio to the step's reject time.
// (Subtracting the measured difference from the run's time is fragile:
// the two are of one size, and noise between them turned it negative.)
func (st *AllocStudy) estimate(r, i int, reject time.Duration) float64 {
	ff := st.FirstFit[r][i]
	if ff.Calls == 0 || st.Reject[r][i] <= 0 {
		return 0
	}
	perCall := ff.Elapsed.Seconds() / float64(ff.Calls)
	scale := float64(reject) / float64(st.Reject[r][i])
	rejects := float64(ff.Calls - ff.Claims)
	elapsed := float64(ff.Claims)*perCall + rejects*perCall*scale
	return float64(ff.Claims) / elapsed
}
