package placement

import (
	"context"
	"fmt"
	"html"
	"io"
	"slices"
	"strings"
	"time"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// Options are one study: the cluster, the workload and the policies.
type Options struct {
	Nodes    []NodeSpec
	Workload Workload
	Policies []string
	// Warmup is the share of requests left out of the figures.
	Warmup float64
	// BatchWindow is bin-packing's batch, in units of time (the mean
	// duration is 1 unless set otherwise).
	BatchWindow float64
	// Sched is the control plane's owner and waits, for SchedPolicies.
	Sched SchedEnv
}

// Study is the results of every policy over one request stream.
type Study struct {
	Options  Options
	GPUs     int
	Requests []Request
	Results  []Result
	Elapsed  time.Duration
}

// Run simulates every policy of opts over the same request stream, each on
// fresh nodes.
func Run(ctx context.Context, opts Options) (*Study, error) {
	start := time.Now()
	sizes := opts.Workload.Mix.Sizes()
	probe, err := NewCluster(ctx, opts.Nodes, sizes)
	if err != nil {
		return nil, err
	}
	st := &Study{Options: opts}
	for _, n := range probe {
		st.GPUs += n.GPUs()
	}
	if st.Requests, err = opts.Workload.Generate(st.GPUs); err != nil {
		return nil, err
	}
	// One control plane serves every real-scheduler row, one after the
	// other; kyb-scheduler runs only for the kyb rows.
	var cp *controlPlane
	withKyb := slices.ContainsFunc(opts.Policies, func(p string) bool { return strings.HasPrefix(p, "kyb-") })
	withDefrag := slices.ContainsFunc(opts.Policies, isDefrag)
	for _, name := range opts.Policies {
		nodes, err := NewCluster(ctx, opts.Nodes, sizes)
		if err != nil {
			return nil, err
		}
		var p Policy
		switch {
		case slices.Contains(DRAPolicies, name):
			p, err = NewDRA(v1alpha1.AllocationPolicy(strings.TrimPrefix(name, "dra-")), nodes, opts.Workload.Seed)
		case slices.Contains(SchedPolicies, name):
			if cp == nil {
				if cp, err = startControlPlane(ctx, opts.Sched, probe, withKyb, withDefrag); err != nil {
					return nil, err
				}
			}
			p, err = newSched(ctx, name, cp, nodes)
		default:
			p, err = NewClassic(name, nodes, opts.BatchWindow)
		}
		if err != nil {
			return nil, err
		}
		res, err := Simulate(ctx, p, nodes, st.Requests, opts.Warmup)
		if c, ok := p.(interface{ Close(context.Context) error }); ok {
			if cerr := c.Close(ctx); cerr != nil && err == nil {
				err = fmt.Errorf("%s: clean up: %w", name, cerr)
			}
		}
		if err != nil {
			return nil, err
		}
		st.Results = append(st.Results, res)
	}
	st.Elapsed = time.Since(start)
	return st, nil
}

// Markdown writes the study's table and its parameters.
func (st *Study) Markdown(w io.Writer) {
	o := st.Options
	var nodes []string
	for _, n := range o.Nodes {
		nodes = append(nodes, fmt.Sprintf("%d× %s", n.Count, n.Preset))
	}
	var mix []string
	for _, k := range o.Workload.Mix.Sizes() {
		mix = append(mix, fmt.Sprintf("%dx %.0f %%", k, 100*o.Workload.Mix[k]))
	}
	fmt.Fprintf(w, "\n### Placement study: %s (%d GPUs), %d requests (%s), offered load %.0f %%, seed %d\n\n",
		strings.Join(nodes, ", "), st.GPUs, len(st.Requests), strings.Join(mix, ", "), 100*o.Workload.Load, o.Workload.Seed)
	// The real-scheduler rows add what shows whether the scheduler saw
	// the cluster as it was (sched.go).
	sched := slices.ContainsFunc(o.Policies, func(p string) bool { return slices.Contains(SchedPolicies, p) })
	defrag := slices.ContainsFunc(o.Policies, isDefrag)
	header, rule := "", ""
	if sched {
		header, rule = " rejected with room | stale rejects retried |", " --- | --- |"
	}
	if defrag {
		header, rule = header+" 4x+ rejected | rejected with the GPUs free | GPUs rejected | evictions (per admitted 4x+ request) | moved, not placed again |", rule+" --- | --- | --- | --- | --- |"
	}
	fmt.Fprintln(w, "| policy | GPU utilization | fragmentation | rejected | split across topology | mean wait | time per placement (mean / p99) |"+header)
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |"+rule)
	for _, r := range st.Results {
		fmt.Fprintf(w, "| %s | %.1f %% | %.1f %% | %.1f %% | %.1f %% | %.3f | %s / %s |", r.Policy, 100*r.Utilization, 100*r.Fragmentation,
			100*r.Rejection, 100*r.Misaligned, r.Wait, dur(r.MeanPlace), dur(r.P99Place))
		if sched {
			fmt.Fprintf(w, " %d of %d | %d |", r.RejectedWithRoom, r.Rejected, r.StaleRejects)
		}
		if defrag {
			per, rejected, gpus := 0.0, 0.0, 0.0
			if r.AdmittedLarge > 0 {
				per = float64(r.Evictions) / float64(r.AdmittedLarge)
			}
			if n := r.AdmittedLarge + r.RejectedLarge; n > 0 {
				rejected = float64(r.RejectedLarge) / float64(n)
			}
			if r.RequestedGPUs > 0 {
				gpus = float64(r.RejectedGPUs) / float64(r.RequestedGPUs)
			}
			fmt.Fprintf(w, " %.1f %% (%d) | %d | %.1f %% | %d (%.2f of %d) | %d |", 100*rejected, r.RejectedLarge, r.RejectedFree, 100*gpus, r.Evictions, per, r.AdmittedLarge, r.Lost)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nArrivals %s, durations %s with mean 1; the first %.0f %% of requests warm the cluster up and are not counted. "+
		"Rejected requests are dropped. Fragmentation: free GPUs outside every fully free 4-GPU topology group, as a share of free GPUs. "+
		"Split across topology: multi-GPU requests not placed on one of the node's topology groups. Simulated in %v.\n",
		o.Workload.Arrival, o.Workload.Duration, 100*o.Warmup, st.Elapsed.Round(time.Second))
	if sched {
		fmt.Fprintf(w, "\nsched-stock and kyb-*: through the real scheduler (the harness's in-process kube-scheduler, the kyb-scheduler binary with the policy by annotation), "+
			"a pod with one ResourceClaim per request; time per placement is from the claim's creation to the pod bound or reported unschedulable. "+
			"Rejected with room: rejects (counted ones) while a node had a whole free group of the request's size; "+
			"stale rejects retried: pods first found unschedulable and bound on the scheduler's retry, over the whole stream.\n")
	}
	if defrag {
		consolidation := ""
		if o.Sched.DefragPeriod > 0 {
			consolidation = fmt.Sprintf(" and --defragmentation-period=%v (wall time)", o.Sched.DefragPeriod)
		}
		fmt.Fprintf(w, "\n-defrag: a second kyb-scheduler with --defragmentation=on%s; every pod a ReplicaSet's, an evicted one created again by the study. "+
			"4x+ rejected: the counted requests of four GPUs or more rejected, as a share of those requests; "+
			"rejected with the GPUs free: counted rejects made while the cluster had as many GPUs free as asked, on nodes or groups that did not fit; "+
			"GPUs rejected: the GPUs of the counted requests rejected, as a share of those the counted requests asked for; "+
			"evictions: pods evicted for the counted requests, and per counted request of four GPUs or more placed; "+
			"moved, not placed again: evicted pods whose replacement fit nowhere, over the whole stream.\n", consolidation)
	}
}

func dur(d time.Duration) string {
	if d >= time.Millisecond {
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.1f µs", float64(d)/1e3)
}

// SVG draws utilization, fragmentation and rejection per policy as grouped
// bars.
func (st *Study) SVG(w io.Writer) {
	const (
		width, height = 900, 360
		left, bottom  = 50, 60
		top           = 40
	)
	series := []struct {
		name  string
		color string
		value func(Result) float64
	}{
		{"GPU utilization", "#2f6fb0", func(r Result) float64 { return r.Utilization }},
		{"fragmentation", "#e08a2c", func(r Result) float64 { return r.Fragmentation }},
		{"rejected", "#c0392b", func(r Result) float64 { return r.Rejection }},
	}
	plotH := float64(height - top - bottom)
	groupW := float64(width-left-20) / float64(max(len(st.Results), 1))
	barW := groupW * 0.8 / float64(len(series))
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(w, `<text x="%d" y="20" font-size="14">Placement policies: %d GPUs, offered load %.0f %%, seed %d</text>`+"\n",
		left, st.GPUs, 100*st.Options.Workload.Load, st.Options.Workload.Seed)
	for pct := 0; pct <= 100; pct += 25 {
		y := float64(top) + plotH*(1-float64(pct)/100)
		fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%d %%</text>`+"\n",
			left, y, width-20, y, left-5, y+4, pct)
	}
	for i, r := range st.Results {
		x0 := float64(left) + groupW*float64(i) + groupW*0.1
		for j, s := range series {
			v := s.value(r)
			h := plotH * v
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %.1f %%</title></rect>`+"\n",
				x0+barW*float64(j), float64(top)+plotH-h, barW, h, s.color, esc(r.Policy), s.name, 100*v)
		}
		fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x0+barW*1.5, height-bottom+16, esc(r.Policy))
	}
	for j, s := range series {
		x := left + 10 + j*170
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, height-22, s.color, x+16, height-12, s.name)
	}
	fmt.Fprintln(w, "</svg>")
}

func esc(s string) string { return html.EscapeString(s) }

// isDefrag says whether a policy's scheduler defragments.
func isDefrag(policy string) bool { return strings.HasSuffix(policy, "-defrag") }
