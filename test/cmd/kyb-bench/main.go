// Command kyb-bench runs the driver's benchmarks against the real
// Kubernetes components (make bench): the scheduler's allocator and the
// in-process kube-scheduler over our ResourceSlices against upstream's
// basic shape, prepare latency against a no-op driver, and the plugin
// binary's footprint. It prints markdown tables of ratios taken within this
// one run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/test/bench"
)

func main() {
	var opts bench.Options
	studies := flag.String("studies", "alloc,allocpatch,prepare,burst,footprint,shim-footprint,sched", "studies to run, comma-separated: alloc, allocpatch, allocsized, prepare, burst, footprint, shim-footprint, sched, kybsched, kybburst, kybpreempt (alloc-figures and decisions: allocpatch's child process; sized-figures: allocsized's)")
	flag.IntVar(&opts.Rounds, "rounds", 3, "rounds of each study; figures are medians over rounds")
	flag.IntVar(&opts.Alloc.RejectNodes, "reject-nodes", 50, "allocator study: full nodes each reject measurement tries")
	flag.IntVar(&opts.Alloc.FirstFitNodes, "firstfit-nodes", 500, "allocator study: nodes of the first-fit run")
	flag.IntVar(&opts.Alloc.FirstFitClaims, "firstfit-claims", 1000, "allocator study: claims of the first-fit run")
	flag.StringVar(&opts.Alloc.Preset, "preset", "dgx-h100", "simulated node of our shape")
	flag.StringVar(&opts.Patch.Patched, "patched", "", "allocator patch and sized seats studies: kyb-bench built against the patched allocator (hack/allocator-patch.sh)")
	flag.IntVar(&opts.Patch.Nodes, "patch-nodes", 500, "allocator patch and sized seats studies: nodes (full ones rejected, and of the first-fit run)")
	flag.Uint64Var(&opts.Patch.Seed, "decisions-seed", 1, "allocator patch study: seed of the random pods whose decisions are compared")
	flag.IntVar(&opts.Patch.Streams, "decisions-streams", 300, "allocator patch study: random clusters compared")
	flag.IntVar(&opts.Patch.Steps, "decisions-steps", 40, "allocator patch study: pods and releases per random cluster")
	flag.IntVar(&opts.Prepare.Concurrent, "prepare-concurrent", 64, "prepare study: claims prepared at once")
	flag.IntVar(&opts.Prepare.Single, "prepare-single", 16, "prepare study: one-claim calls made one after the other in a pass")
	flag.IntVar(&opts.Prepare.Passes, "prepare-passes", 8, "prepare study: passes of one-claim calls (their p99 rests on single x passes samples)")
	flag.IntVar(&opts.Prepare.Bursts, "prepare-bursts", 3, "prepare study: bursts of concurrent claims per round (their p99 rests on concurrent x bursts samples)")
	qps := flag.Float64("prepare-qps", 1000, "prepare study: both drivers' client QPS")
	flag.IntVar(&opts.Prepare.Burst, "prepare-burst", 1000, "prepare study: both drivers' client burst")
	bgQPS := flag.Float64("prepare-background-qps", 0, "prepare study: our plugin's background client QPS (claim statuses, events); 0: -prepare-qps")
	flag.IntVar(&opts.Prepare.BackgroundBurst, "prepare-background-burst", 0, "prepare study: our plugin's background client burst; 0: -prepare-burst")
	burstSizes := flag.String("burst-sizes", "8,32,64", "burst study: pods prepared at once on one node, comma-separated")
	flag.IntVar(&opts.Burst.Rounds, "burst-rounds", 1, "burst study: rounds (each a burst of every size per driver and limits)")
	flag.BoolVar(&opts.Burst.ShippedOnly, "burst-shipped-only", false, "burst study: measure only the limits the plugin ships with")
	schedNodes := flag.String("sched-nodes", "100,250,500", "scheduler study: node counts, comma-separated")
	flag.StringVar(&opts.Sched.Profile, "sched-profile", "", "scheduler study: CPU-profile the empty-node rounds at the largest count into <prefix>-basic.pprof and <prefix>-ours.pprof")
	flag.IntVar(&opts.Sched.Pods, "sched-pods", 400, "scheduler study: pods scheduled onto empty nodes per shape and round")
	flag.Float64Var(&opts.Sched.BusyShare, "sched-busy-share", 0.9, "scheduler study: share of the nodes full in the busy-cluster scenario")
	flag.Float64Var(&opts.Sched.BusyFill, "sched-busy-fill", 0.6, "scheduler study: share of the free nodes' seats the pods released onto the busy cluster take")
	flag.StringVar(&opts.KybSched.KybScheduler, "kyb-scheduler", "bin/kyb-scheduler", "kyb-scheduler studies: the kyb-scheduler binary (make kyb-scheduler)")
	flag.StringVar(&opts.KybSched.KubeScheduler, "kube-scheduler", "", "kyb-scheduler studies: stock kube-scheduler of the test module's Kubernetes as a binary; empty: stock kube-scheduler in this process")
	flag.StringVar(&opts.KybSched.Compare, "kyb-scheduler-compare", "", "kyb-scheduler study: another kyb-scheduler binary (an earlier build), measured with its built-in profile as a fifth run taking turns with the others")
	flag.StringVar(&opts.KybSched.Profile, "kybsched-profile", "", "kyb-scheduler study: CPU-profile every round of every scheduler process into <prefix>-<nodes>-<empty|busy>-<run>-r<round>/ (go tool pprof merges a directory's files)")
	flag.IntVar(&opts.KybSched.BurstNodes, "kybburst-nodes", 10, "kyb-scheduler burst study: nodes, all but one full")
	flag.IntVar(&opts.KybSched.BurstWait, "kybburst-wait", 60, "kyb-scheduler burst study: seconds to wait for the burst's pods before counting those left pending")
	flag.IntVar(&opts.KybSched.PreemptNodes, "kybpreempt-nodes", 100, "kyb-scheduler preemption study: nodes, all full of low-priority seats")
	flag.IntVar(&opts.KybSched.Preemptions, "kybpreempt-pods", 5, "kyb-scheduler preemption study: high-priority 4x pods per round under kyb-scheduler")
	flag.IntVar(&opts.KybSched.PreemptWait, "kybpreempt-wait", 60, "kyb-scheduler preemption study: seconds to wait for each high-priority pod to be bound")
	flag.StringVar(&opts.Footprint.Plugin, "plugin", "bin/kyb-dra-plugin", "footprint study: the plugin binary")
	flag.IntVar(&opts.Footprint.Cycles, "cycles", 1000, "footprint study: prepare/unprepare cycles")
	flag.StringVar(&opts.ShimFootprint.Shim, "shim", "bin/kyb-device-plugin", "shim footprint study: the shim binary")
	flag.IntVar(&opts.ShimFootprint.Allocations, "shim-allocations", 1000, "shim footprint study: Allocate calls after start")
	flag.IntVar(&opts.Footprint.Held, "cycles-held", 50, "footprint study: claims held prepared at a time, until their statuses are written (at most the node's 64 one-GPU seats)")
	out := flag.String("o", "", "also write the tables to this file")
	logFile := flag.String("log", "_output/bench.log", "where the control plane logs")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (control plane and drivers share the process) to this file")
	flag.Parse()
	opts.Studies = strings.Split(*studies, ",")
	opts.Burst.Sizes = counts("burst-sizes", *burstSizes)
	opts.Sched.Nodes = counts("sched-nodes", *schedNodes)
	opts.Prepare.QPS = float32(*qps)
	opts.Prepare.BackgroundQPS = float32(*bgQPS)
	opts.Sched.Preset = opts.Alloc.Preset
	// The kyb-scheduler study measures the scheduler study's scenarios.
	opts.KybSched.Nodes, opts.KybSched.Pods, opts.KybSched.Preset = opts.Sched.Nodes, opts.Sched.Pods, opts.Alloc.Preset
	opts.KybSched.BusyShare, opts.KybSched.BusyFill = opts.Sched.BusyShare, opts.Sched.BusyFill
	opts.Patch.Preset, opts.Patch.FirstFitClaims = opts.Alloc.Preset, opts.Alloc.FirstFitClaims

	if err := os.MkdirAll("_output", 0o755); err != nil {
		fail(err)
	}
	log, err := os.Create(*logFile)
	if err != nil {
		fail(err)
	}
	defer log.Close()
	// The control plane logs a lot; keep it out of the tables.
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := klogFlags.Set(k, v); err != nil {
			fail(err)
		}
	}
	klog.SetOutput(log)
	opts.Log = io.MultiWriter(os.Stderr, log)

	var w io.Writer = os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fail(err)
		}
		defer f.Close()
		w = io.MultiWriter(os.Stdout, f)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fail(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.Run(ctx, opts, w); err != nil {
		stop()
		fail(err)
	}
}

// counts parses a flag's comma-separated list of positive counts.
func counts(name, list string) []int {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fail(fmt.Errorf("-%s: %q is not a positive count", name, f))
		}
		out = append(out, n)
	}
	return out
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "kyb-bench: %v\n", err)
	os.Exit(1)
}
