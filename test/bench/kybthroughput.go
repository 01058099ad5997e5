package bench

import (
	"context"
	"fmt"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// Goals of kyb-scheduler's throughput: at least stock kube-scheduler's
// pods/s on upstream's basic shape, and the score costing at most a tenth
// of kyb-scheduler's pods/s without it.
const (
	KybSchedGoal     = 1.0
	KybScoreCostGoal = 0.10
)

// KybSchedStudy is the schedulers' throughput, as processes, on our shape
// against stock kube-scheduler on upstream's basic shape.
type KybSchedStudy struct {
	Options   KybSchedOptions
	Scenarios []*KybSchedScenario
}

// kybRun is one scheduler on one shape.
type kybRun struct {
	Shape     Shape
	Scheduler schedulerUnderTest
}

// KybSchedScenario is one situation the pods are released into, and the
// runs measured in it: basic under stock kube-scheduler (the basis of the
// ratios), ours under stock, ours under kyb-scheduler with and without the
// score.
type KybSchedScenario struct {
	Name  string
	Nodes int
	Runs  []kybRun
	Full  int
	// Pods per run.
	Pods []int
	// PodsPerSecond and Attempts (per pod) per round, per run.
	PodsPerSecond, Attempts [][]float64
	// Costs per round, per run: a scheduler process's times per cycle.
	Costs [][]cycleCosts
	// CPUPerPod per round, per run: the scheduler process's CPU seconds
	// per pod, 0 in-process.
	CPUPerPod [][]float64
}

// Indices of the runs in a scenario.
const (
	runBasicStock = iota
	runOursStock
	runOursKyb
	runOursKybNoScore
)

// runFiles name the runs in profile directories; the one after
// runOursKybNoScore is the other kyb-scheduler build, where one is given.
var runFiles = []string{"basic-stock", "ours-stock", "ours-kyb", "ours-kyb-noscore", "ours-kyb-compare"}

// RunKybSched measures the schedulers at each node count, on empty nodes
// and on a busy cluster (where BusyShare leaves a node full), as RunSched
// does; the runs take turns, the first
// rotating from round to round.
func RunKybSched(ctx context.Context, c *harness.Cluster, opts KybSchedOptions) (*KybSchedStudy, error) {
	ours, err := KybShape(ctx, "ours ("+opts.Preset+")", opts.Preset, "", "1x")
	if err != nil {
		return nil, err
	}
	basic := BasicShape()
	if err := createClasses(ctx, c, basic, ours); err != nil {
		return nil, err
	}
	stock := stockScheduler(opts)
	runs := []kybRun{{basic, stock}, {ours, stock}, {ours, kybScheduler(opts, true)}, {ours, kybScheduler(opts, false)}}
	if opts.Compare != "" {
		runs = append(runs, kybRun{ours, kybSchedulerBinary(opts.Compare, "kyb-scheduler "+opts.Compare+" (built-in profile)", "")})
	}
	st := &KybSchedStudy{Options: opts}
	for _, n := range opts.Nodes {
		full := int(float64(n)*opts.BusyShare + 0.5)
		busyPods := func(s Shape) int { return int(float64((n-full)*s.PerNode)*opts.BusyFill + 0.5) }
		empty := &KybSchedScenario{Name: "empty nodes", Nodes: n, Runs: runs}
		busy := &KybSchedScenario{Name: fmt.Sprintf("busy: %d of %d nodes full", full, n), Nodes: n, Runs: runs, Full: full}
		for _, r := range runs {
			empty.Pods = append(empty.Pods, min(opts.Pods, n*ours.PerNode/2))
			busy.Pods = append(busy.Pods, busyPods(r.Shape))
		}
		st.Scenarios = append(st.Scenarios, empty)
		if full > 0 {
			st.Scenarios = append(st.Scenarios, busy)
		}
	}
	for _, sc := range st.Scenarios {
		for i, r := range sc.Runs {
			if free := (sc.Nodes - sc.Full) * r.Shape.PerNode; sc.Pods[i] > free || sc.Pods[i] < 10 {
				return nil, fmt.Errorf("kyb-scheduler study: %d pods for %d free nodes of %s: too many, or too few to measure", sc.Pods[i], sc.Nodes-sc.Full, r.Shape.Name)
			}
		}
	}
	for round := 0; round < opts.Rounds; round++ {
		for si, sc := range st.Scenarios {
			rates := make([]float64, len(sc.Runs))
			attempts := make([]float64, len(sc.Runs))
			costs := make([]cycleCosts, len(sc.Runs))
			cpu := make([]float64, len(sc.Runs))
			for k := range sc.Runs {
				i := (k + round) % len(sc.Runs)
				r := sc.Runs[i]
				id := fmt.Sprintf("k%d-c%d-s%d", round, si, i)
				res, err := func() (roundResult, error) {
					target, stop := r.Scheduler.start(ctx, c, id)
					defer stop()
					profile := ""
					if opts.Profile != "" {
						kind := "empty"
						if sc.Full > 0 {
							kind = "busy"
						}
						profile = fmt.Sprintf("%s-%d-%s-%s-r%d", opts.Profile, sc.Nodes, kind, runFiles[i], round)
					}
					res, err := schedRound(ctx, c, target, r.Shape, id, sc.Nodes, sc.Full, sc.Pods[i], profile)
					if err == nil && target.costs != nil {
						costs[i], err = target.costs(ctx)
					}
					return res, err
				}()
				if err != nil {
					return nil, fmt.Errorf("round %d, %d nodes, %s, %s under %s: %w", round, sc.Nodes, sc.Name, r.Shape.Name, r.Scheduler.Name, err)
				}
				rates[i] = res.rate
				attempts[i] = res.attempts / float64(sc.Pods[i])
				cpu[i] = res.cpu / float64(sc.Pods[i])
			}
			sc.PodsPerSecond = append(sc.PodsPerSecond, rates)
			sc.Attempts = append(sc.Attempts, attempts)
			sc.Costs = append(sc.Costs, costs)
			sc.CPUPerPod = append(sc.CPUPerPod, cpu)
		}
	}
	return st, nil
}

// Table summarises the study.
func (st *KybSchedStudy) Table() *Table {
	t := &Table{
		Title: fmt.Sprintf("kyb-scheduler's throughput against stock kube-scheduler, %v nodes (median of %d rounds)", st.Options.Nodes, st.Options.Rounds),
		Header: []string{"nodes", "pods released onto", "shape", "scheduler", "pods", "pods/s", "ratio to basic under stock",
			fmt.Sprintf("goal ≥ %.1fx", KybSchedGoal), "ms per scheduling cycle", "score's ms per cycle (share)",
			fmt.Sprintf("goal: score ≤ %.0f %%", 100*KybScoreCostGoal), "score's steps, ms per cycle: PreFilter / DeviceOrder / PreScore", "pods/s with score / without", "scheduler CPU ms per pod", "CPU per pod, ratio to basic under stock", "DRA Filter calls per pod", "scheduling attempts per pod"},
	}
	ms := func(x float64) string { return fmt.Sprintf("%.2f", 1000*x) }
	for _, sc := range st.Scenarios {
		for i, r := range sc.Runs {
			var rates, ratios, withWithout, attempts, attempt, score, share, cpu, cpuRatios, filters []float64
			for round, rs := range sc.PodsPerSecond {
				rates = append(rates, rs[i])
				if c := sc.CPUPerPod[round]; c[runBasicStock] > 0 {
					cpu, cpuRatios = append(cpu, c[i]), append(cpuRatios, c[i]/c[runBasicStock])
				}
				ratios = append(ratios, rs[i]/rs[runBasicStock])
				withWithout = append(withWithout, rs[runOursKyb]/rs[runOursKybNoScore])
				attempts = append(attempts, sc.Attempts[round][i])
				c := sc.Costs[round][i]
				attempt, score, share = append(attempt, c.attempt), append(score, c.score), append(share, c.scoreShare())
				filters = append(filters, c.draFilters/float64(sc.Pods[i]))
			}
			ratio := Median(ratios)
			goal, ww, costGoal, attemptCol, scoreCol, stepsCol := "", "", "", "", "", ""
			if Median(attempt) > 0 {
				attemptCol = perRound(attempt, ms)
			}
			cpuCol, cpuRatioCol, filterCol := "", "", ""
			if Median(filters) > 0 {
				filterCol = perRound(filters, func(x float64) string { return fmt.Sprintf("%.0f", x) })
			}
			if len(cpu) > 0 {
				cpuCol, cpuRatioCol = perRound(cpu, ms), perRound(cpuRatios, Ratio)
			}
			if i == runOursKyb {
				goal = Verdict(ratio >= KybSchedGoal)
				ww = perRound(withWithout, Ratio)
				scoreCol, costGoal = "not timed (no kyb_placement_duration_seconds)", ""
				if timed(sc.Costs, i) {
					scoreCol = fmt.Sprintf("%s (%.1f %%)", perRound(score, ms), 100*Median(share))
					costGoal = Verdict(Median(share) <= KybScoreCostGoal)
					var parts []string
					for _, step := range []string{"PreFilter", "DeviceOrder", "PreScore"} {
						var per []float64
						for round := range sc.Costs {
							per = append(per, sc.Costs[round][i].steps[step])
						}
						parts = append(parts, ms(Median(per)))
					}
					stepsCol = strings.Join(parts, " / ")
				}
			}
			t.Rows = append(t.Rows, []string{fmt.Sprint(sc.Nodes), sc.Name, r.Shape.Name, r.Scheduler.Name, fmt.Sprint(sc.Pods[i]),
				perRound(rates, func(x float64) string { return fmt.Sprintf("%.0f", x) }), perRound(ratios, Ratio), goal, attemptCol, scoreCol, costGoal, stepsCol, ww,
				cpuCol, cpuRatioCol, filterCol, fmt.Sprintf("%.2f", Median(attempts))})
		}
	}
	stock := "Stock kube-scheduler is the test module's k8s.io/kubernetes cmd/kube-scheduler built as a binary, with its default plugins"
	if st.Options.KubeScheduler == "" {
		stock = "Stock kube-scheduler runs in the bench's process (no binary given): it shares the Go runtime with the API server and etcd, " +
			"the kyb-scheduler processes do not, so the ratios mix that difference in"
	}
	t.Notes = []string{fmt.Sprintf("Each scheduler runs as a process of its own, one at a time, started for its turn and stopped after it, "+
		"with a client at QPS 5,000 (scheduler_perf's limits, as the in-process study's). %s. kyb-scheduler without the score is its built-in "+
		"profile less KybPlacement (NodeResourcesFit MostAllocated, the default plugins): the last two rows of a scenario differ by the score alone. "+
		"kyb-scheduler also differs from stock by its patches (allocator, in-flight share) and by the GenericWorkload gate it turns on. "+
		"Pods, release, busy clusters and pods/s as in the in-process study (busy: the pods take %.0f %% of the free nodes' seats); "+
		"ratios are taken per round; a figure is the median of the rounds (the lower middle for an even count), each round's in parentheses. "+
		"Upstream's scheduler_perf threshold for its basic shape at 500 nodes (5000pods_500nodes) is %d pods/s on its CI machines since Kubernetes 1.37.",
		stock, 100*st.Options.BusyFill, UpstreamBasicThreshold),
		"Times per scheduling cycle are the scheduler's own metrics for the round, recorded in every cycle: " +
			"scheduler_scheduling_algorithm_duration_seconds (a pod's filtering and scoring, binding not included) and kyb-scheduler's " +
			"kyb_placement_duration_seconds (the score's PreFilter, the device order it hands the DynamicResources plugin's allocator, " +
			"its PreScore; its Score, a look-up per node, is not timed). The framework's sampled plugin metric is not used: it drops " +
			"observations while its buffer is full, which Filter fills on a few hundred nodes. The score's goal is judged on its own " +
			"time per cycle; pods/s with the score against without it also differ by where the policy puts the pods, which changes " +
			"the DRA plugin's Filter work (which nodes are full when it tries them).",
		"Scheduler CPU per pod is the process's process_cpu_seconds_total from the release to the round's last attempt, over the pods: " +
			"every cycle, binding, event and informer update of the round, whatever else the machine runs, where pods/s also waits for the " +
			"API server and etcd that share the machine. Empty with the in-process scheduler.",
		"DRA Filter calls per pod are the process's scheduler_plugin_evaluation_total for the DynamicResources plugin's Filter, one per pod and " +
			"node it ran on, over the pods: the nodes a pod's cycle tried past the filters before it (the round's label, resources)."}
	if st.Options.Compare != "" {
		t.Notes = append(t.Notes, fmt.Sprintf("The last row of each scenario is another kyb-scheduler build, %s, with its built-in profile, "+
			"taking turns with the other runs in every round.", st.Options.Compare))
	}
	return t
}

// timed says whether the framework timed run i's score in every round.
func timed(costs [][]cycleCosts, i int) bool {
	for _, cs := range costs {
		if cs[i].scoreCycles == 0 {
			return false
		}
	}
	return len(costs) > 0
}

// perRound formats the median of xs, and with more than one round each
// round's figure: on a shared machine one round can be far off the others.
func perRound(xs []float64, format func(float64) string) string {
	if len(xs) < 2 {
		return format(Median(xs))
	}
	each := make([]string, len(xs))
	for i, x := range xs {
		each[i] = format(x)
	}
	return fmt.Sprintf("%s (%s)", format(Median(xs)), strings.Join(each, ", "))
}
