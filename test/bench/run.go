package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// Options choose the studies and their sizes.
type Options struct {
	// Studies to run: alloc, allocpatch, sched, kybsched, kybburst,
	// prepare, footprint, shim-footprint; alloc-figures and decisions are
	// allocpatch's child process's.
	Studies []string
	// Rounds of each study; figures are medians over rounds.
	Rounds int
	Alloc  AllocOptions
	// Patch is the allocator patch study (and its child process's
	// alloc-figures and decisions).
	Patch PatchOptions
	// Prepare is the prepare latency study.
	Prepare PrepareOptions
	Sched   SchedOptions
	// KybSched is the kyb-scheduler studies' (kybsched, kybburst).
	KybSched KybSchedOptions
	// Burst is the prepare burst study at the shipped rate limits.
	Burst BurstOptions
	// Footprint is the plugin binary's footprint study.
	Footprint FootprintOptions
	// ShimFootprint is the shim binary's, which needs no cluster.
	ShimFootprint ShimFootprintOptions
	// Log receives the control plane's progress lines.
	Log io.Writer
}

// Run runs the chosen studies and writes their tables to out as markdown.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	has := func(s string) bool { return slices.Contains(opts.Studies, s) }
	if has("alloc") {
		start := time.Now()
		st, err := RunAlloc(ctx, opts.Alloc, opts.Rounds)
		if err != nil {
			return fmt.Errorf("allocator study: %w", err)
		}
		for _, t := range st.Tables() {
			t.Write(out)
		}
		fmt.Fprintf(opts.Log, "allocator study: %v\n", time.Since(start).Round(time.Second))
	}
	if has("allocpatch") {
		start := time.Now()
		st, err := RunPatch(ctx, opts.Patch, opts.Rounds)
		if err != nil {
			return fmt.Errorf("allocator patch study: %w", err)
		}
		st.Table().Write(out)
		fmt.Fprintf(opts.Log, "allocator patch study: %v\n", time.Since(start).Round(time.Second))
	}
	if has("alloc-figures") {
		f, err := MeasureAllocFigures(ctx, opts.Patch)
		if err != nil {
			return fmt.Errorf("allocator figures: %w", err)
		}
		if err := json.NewEncoder(out).Encode(f); err != nil {
			return err
		}
	}
	if has("decisions") {
		if err := WriteDecisions(ctx, out, opts.Patch); err != nil {
			return fmt.Errorf("allocator decisions: %w", err)
		}
	}
	if has("shim-footprint") {
		start := time.Now()
		st, err := RunShimFootprint(ctx, opts.ShimFootprint)
		if err != nil {
			return fmt.Errorf("shim footprint study: %w", err)
		}
		st.Table().Write(out)
		fmt.Fprintf(opts.Log, "shim footprint study: %v\n", time.Since(start).Round(time.Second))
	}
	needCluster := has("prepare") || has("burst") || has("sched") || has("footprint") || has("kybsched") || has("kybburst")
	if !needCluster {
		return nil
	}
	tb := harness.NewProcessTB(opts.Log)
	defer tb.Close()
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				if f, ok := r.(harness.FatalError); ok {
					err = fmt.Errorf("cluster: %s", f.Msg)
					return
				}
				panic(r)
			}
		}()
		err = runWithCluster(ctx, tb, opts, out)
	}()
	return err
}

func runWithCluster(ctx context.Context, tb *harness.ProcessTB, opts Options, out io.Writer) error {
	has := func(s string) bool { return slices.Contains(opts.Studies, s) }
	copts := harness.Options{}
	if has("kybsched") || has("kybburst") {
		copts = KybSchedClusterOptions()
	}
	c := harness.Start(tb, copts)
	if has("prepare") {
		start := time.Now()
		p := opts.Prepare
		p.Rounds = opts.Rounds
		st, err := RunPrepare(ctx, c, p)
		if err != nil {
			return fmt.Errorf("prepare study: %w", err)
		}
		st.Table().Write(out)
		st.StepTable().Write(out)
		fmt.Fprintf(opts.Log, "prepare study: %v\n", time.Since(start).Round(time.Second))
	}
	if has("burst") {
		start := time.Now()
		st, err := RunBurst(ctx, c, opts.Burst)
		if err != nil {
			return fmt.Errorf("burst study: %w", err)
		}
		st.Table().Write(out)
		fmt.Fprintf(opts.Log, "burst study: %v\n", time.Since(start).Round(time.Second))
	}
	if has("footprint") {
		start := time.Now()
		st, err := RunFootprint(ctx, c, opts.Footprint)
		if err != nil {
			return fmt.Errorf("footprint study: %w", err)
		}
		st.Table().Write(out)
		fmt.Fprintf(opts.Log, "footprint study: %v\n", time.Since(start).Round(time.Second))
	}
	if has("sched") {
		start := time.Now()
		s := opts.Sched
		s.Rounds = opts.Rounds
		st, err := RunSched(ctx, c, s)
		if err != nil {
			return fmt.Errorf("scheduler study: %w", err)
		}
		st.Table().Write(out)
		fmt.Fprintf(opts.Log, "scheduler study: %v\n", time.Since(start).Round(time.Second))
	}
	if has("kybsched") {
		start := time.Now()
		k := opts.KybSched
		k.Rounds = opts.Rounds
		st, err := RunKybSched(ctx, c, k)
		if err != nil {
			return fmt.Errorf("kyb-scheduler study: %w", err)
		}
		st.Table().Write(out)
		fmt.Fprintf(opts.Log, "kyb-scheduler study: %v\n", time.Since(start).Round(time.Second))
	}
	if has("kybburst") {
		start := time.Now()
		k := opts.KybSched
		k.Rounds = opts.Rounds
		st, err := RunKybBurst(ctx, c, k)
		if err != nil {
			return fmt.Errorf("kyb-scheduler burst study: %w", err)
		}
		st.Table().Write(out)
		fmt.Fprintf(opts.Log, "kyb-scheduler burst study: %v\n", time.Since(start).Round(time.Second))
	}
	return nil
}
