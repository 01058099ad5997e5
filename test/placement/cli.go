package placement

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// Main is kyb-sim: it parses args, runs the study and writes the table to
// stdout (and -o), the plot to -svg. Errors are printed to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := run(ctx, args, stdout)
	if err != nil && err != flag.ErrHelp {
		fmt.Fprintf(stderr, "kyb-sim: %v\n", err)
	}
	return err
}

// controlPlaneOwner sends the control plane's logs (klog's, process-wide)
// to file, or nowhere, and returns the owner of its lifetime.
func controlPlaneOwner(file string) (tb *harness.ProcessTB, closeLog func(), err error) {
	log := io.Discard
	closeLog = func() {}
	if file != "" {
		f, err := os.Create(file)
		if err != nil {
			return nil, nil, fmt.Errorf("-log: %w", err)
		}
		log, closeLog = f, func() { _ = f.Close() }
	}
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := klogFlags.Set(k, v); err != nil {
			closeLog()
			return nil, nil, err
		}
	}
	klog.SetOutput(log)
	return harness.NewProcessTB(log), closeLog, nil
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kyb-sim", flag.ContinueOnError)
	nodes := fs.String("nodes", "dgx-h100:4,nvlink-2x4:4,pcie-8gpu:4", "nodes: <preset>:<count>,...")
	mix := fs.String("mix", "1x:0.6,2x:0.3,4x:0.1", "request sizes and their shares")
	policies := fs.String("policies", strings.Join(append(slices.Clone(ClassicPolicies), DRAPolicies...), ","), "policies to compare")
	var w Workload
	fs.Uint64Var(&w.Seed, "seed", 1, "random seed")
	fs.IntVar(&w.Requests, "requests", 5000, "requests to replay")
	fs.StringVar(&w.Arrival, "arrival", "exp", "inter-arrival distribution: "+strings.Join(Distributions, ", "))
	fs.StringVar(&w.Duration, "duration", "lognormal", "duration distribution: "+strings.Join(Distributions, ", "))
	fs.Float64Var(&w.Load, "load", 1.0, "offered load: GPUs the requests would keep busy, as a share of the cluster's")
	warmup := fs.Float64("warmup", 0.1, "share of requests that warm the cluster up and are not counted")
	batch := fs.Float64("batch-window", 0.05, "bin-packing's batch window, in mean durations")
	kybScheduler := fs.String("kyb-scheduler", "", "the kyb-scheduler binary for the kyb-* policies (default $KYB_SCHEDULER, else built from cmd/kyb-scheduler)")
	settle := fs.Duration("settle", 20*time.Millisecond, "real-scheduler policies: wait after a release is seen, before the next placement")
	defragPeriod := fs.Duration("defrag-period", 0, "-defrag policies: their scheduler also consolidates once per period of wall time (0: never)")
	logFile := fs.String("log", "", "real-scheduler policies: where the control plane logs, etcd in FILE.etcd (default: nowhere)")
	out := fs.String("o", "", "also write the markdown table to this file")
	svg := fs.String("svg", "", "write a plot (SVG) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	w.MeanDuration = 1
	opts := Options{Workload: w, Warmup: *warmup, BatchWindow: *batch}
	var err error
	if opts.Nodes, err = ParseNodes(*nodes); err != nil {
		return err
	}
	if opts.Workload.Mix, err = ParseMix(*mix); err != nil {
		return err
	}
	known := append(append(slices.Clone(ClassicPolicies), DRAPolicies...), SchedPolicies...)
	for _, p := range strings.Split(*policies, ",") {
		if !slices.Contains(known, p) {
			return fmt.Errorf("-policies: unknown policy %q (known: %s)", p, strings.Join(known, ", "))
		}
		opts.Policies = append(opts.Policies, p)
	}
	if *warmup < 0 || *warmup >= 1 {
		return fmt.Errorf("-warmup %v: must be in [0, 1)", *warmup)
	}
	if slices.ContainsFunc(opts.Policies, func(p string) bool { return slices.Contains(SchedPolicies, p) }) {
		tb, closeLog, err := controlPlaneOwner(*logFile)
		if err != nil {
			return err
		}
		defer closeLog()
		defer tb.Close()
		opts.Sched = DefaultSchedEnv(tb)
		opts.Sched.KybScheduler, opts.Sched.Settle, opts.Sched.DefragPeriod = *kybScheduler, *settle, *defragPeriod
		opts.Sched.EtcdLog = os.DevNull
		if *logFile != "" {
			opts.Sched.EtcdLog = *logFile + ".etcd"
		}
	}
	st, err := Run(ctx, opts)
	if err != nil {
		return err
	}
	targets := []io.Writer{stdout}
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		targets = append(targets, f)
	}
	st.Markdown(io.MultiWriter(targets...))
	if *svg != "" {
		f, err := os.Create(*svg)
		if err != nil {
			return err
		}
		st.SVG(f)
		if err := f.Close(); err != nil {
			return fmt.Errorf("write %s: %w", *svg, err)
		}
	}
	return nil
}
