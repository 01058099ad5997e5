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
	// Studies to run: alloc, allocpatch, allocsized, sched, kybsched,
	// kybburst, kybpreempt, prepare, footprint, shim-footprint;
	// alloc-figures and decisions are allocpatch's child process's,
	// sized-figures allocsized's.
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
		if err := runStudy(opts, out, "allocator study", func() ([]*Table, error) {
			st, err := RunAlloc(ctx, opts.Alloc, opts.Rounds)
			if err != nil {
				return nil, err
			}
			return st.Tables(), nil
		}); err != nil {
			return err
		}
	}
	if has("allocpatch") {
		if err := runStudy(opts, out, "allocator patch study", func() ([]*Table, error) { return one(RunPatch(ctx, opts.Patch, opts.Rounds)) }); err != nil {
			return err
		}
	}
	if has("allocsized") {
		if err := runStudy(opts, out, "sized seats allocator study", func() ([]*Table, error) { return one(RunSized(ctx, opts.Patch, opts.Rounds)) }); err != nil {
			return err
		}
	}
	if has("sized-figures") {
		f, err := MeasureSizedFigures(ctx, opts.Patch)
		if err != nil {
			return fmt.Errorf("sized seats allocator figures: %w", err)
		}
		if err := json.NewEncoder(out).Encode(f); err != nil {
			return err
		}
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
		if err := runStudy(opts, out, "shim footprint study", func() ([]*Table, error) { return one(RunShimFootprint(ctx, opts.ShimFootprint)) }); err != nil {
			return err
		}
	}
	needCluster := has("prepare") || has("burst") || has("sched") || has("footprint") || has("kybsched") || has("kybburst") || has("kybpreempt")
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
	if has("kybsched") || has("kybburst") || has("kybpreempt") {
		copts = KybSchedClusterOptions()
	}
	c := harness.Start(tb, copts)
	p, s, k := opts.Prepare, opts.Sched, opts.KybSched
	p.Rounds, s.Rounds, k.Rounds = opts.Rounds, opts.Rounds, opts.Rounds
	for _, study := range []struct {
		key, name string
		run       func() ([]*Table, error)
	}{
		{"prepare", "prepare study", func() ([]*Table, error) {
			st, err := RunPrepare(ctx, c, p)
			if err != nil {
				return nil, err
			}
			return []*Table{st.Table(), st.StepTable()}, nil
		}},
		{"burst", "burst study", func() ([]*Table, error) { return one(RunBurst(ctx, c, opts.Burst)) }},
		{"footprint", "footprint study", func() ([]*Table, error) { return one(RunFootprint(ctx, c, opts.Footprint)) }},
		{"sched", "scheduler study", func() ([]*Table, error) { return one(RunSched(ctx, c, s)) }},
		{"kybsched", "kyb-scheduler study", func() ([]*Table, error) { return one(RunKybSched(ctx, c, k)) }},
		{"kybburst", "kyb-scheduler burst study", func() ([]*Table, error) { return one(RunKybBurst(ctx, c, k)) }},
	} {
		if !has(study.key) {
			continue
		}
		if err := runStudy(opts, out, study.name, study.run); err != nil {
			return err
		}
	}
	if has("kybpreempt") {
		start := time.Now()
		k := opts.KybSched
		k.Rounds = opts.Rounds
		st, err := RunKybPreempt(ctx, c, k)
		if err != nil {
			return fmt.Errorf("kyb-scheduler preemption study: %w", err)
		}
		st.Table().Write(out)
		fmt.Fprintf(opts.Log, "kyb-scheduler preemption study: %v\n", time.Since(start).Round(time.Second))
	}
	return nil
}

// one is the table of a study that reports one.
func one[S interface{ Table() *Table }](st S, err error) ([]*Table, error) {
	if err != nil {
		return nil, err
	}
	return []*Table{st.Table()}, nil
}

// runStudy runs one study, writes the tables it reports to out and logs
// how long it took.
func runStudy(opts Options, out io.Writer, name string, run func() ([]*Table, error)) error {
	start := time.Now()
	tables, err := run()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for _, t := range tables {
		t.Write(out)
	}
	fmt.Fprintf(opts.Log, "%s: %v\n", name, time.Since(start).Round(time.Second))
	return nil
}
