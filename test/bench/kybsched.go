package bench

import (
	"context"
	"fmt"
	"maps"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// The kyb-scheduler studies run the schedulers as processes of their own,
// as a cluster runs them: kyb-scheduler (the real binary) with its
// built-in profile, kyb-scheduler with the placement score left out (the
// same plugins and weights otherwise, so that the difference is the
// score's own cost), and stock kube-scheduler of the same Kubernetes
// version built as a binary. Stock kube-scheduler in this process (the
// sched study's) shares the CPUs' caches and the Go runtime with the API
// server and etcd, a process does not: comparing a process with it would
// mix that difference into the figures. Where no stock binary is given,
// the stock figures are the in-process scheduler's, and the tables say so.
//
// One scheduler runs at a time: each is started for its turn and stopped
// after it, so that no idle scheduler's informers take CPU from the one
// measured. The cluster's in-process default scheduler runs throughout,
// idle (no pod names it), the same for every turn.

// KybSchedOptions size the kyb-scheduler studies.
type KybSchedOptions struct {
	// Nodes, Pods, BusyShare and BusyFill are the throughput study's, as
	// SchedOptions's.
	Nodes               []int
	Pods                int
	Rounds              int
	BusyShare, BusyFill float64
	// Preset is our node.
	Preset string
	// KybScheduler is the kyb-scheduler command; "" for the harness's
	// ($KYB_SCHEDULER, else a build).
	KybScheduler string
	// KubeScheduler is stock kube-scheduler as a command (the test
	// module's k8s.io/kubernetes/cmd/kube-scheduler); "" measures the
	// in-process stock scheduler instead.
	KubeScheduler string
	// Compare, when set, is another kyb-scheduler command (an earlier
	// build), measured with its built-in profile as a fifth run taking
	// turns with the others, so that two builds are compared within one
	// run's rounds, not across runs on a machine whose pace drifts.
	Compare string
	// BurstNodes are the burst study's nodes: all but one full.
	BurstNodes int
	// BurstWait is how long the burst study waits for its pods, in
	// seconds, before it counts those left pending.
	BurstWait int
	// Profile, when set, is a directory prefix: every round of every
	// scheduler process is CPU-profiled from the release to its last pod
	// into <prefix>-<nodes>-<empty|busy>-<run>-r<round>/ (one file a
	// second; `go tool pprof` merges a directory's). Profiling adds its
	// own CPU to the round's.
	Profile string
	// PreemptNodes are the preemption study's nodes, all full;
	// Preemptions its high-priority pods per round under kyb-scheduler;
	// PreemptWait how long it waits for each to be bound, in seconds.
	PreemptNodes, Preemptions, PreemptWait int
}

// Scheduler names the pods of each process use.
const (
	kybSchedulerName   = "kyb-scheduler"
	stockSchedulerName = "stock-scheduler"
)

// schedulerUnderTest is one scheduler the studies measure.
type schedulerUnderTest struct {
	Name string
	// start starts it for one turn and returns what its pods name and how
	// to stop it.
	start func(ctx context.Context, c *harness.Cluster, turn string) (schedTarget, func())
}

// KybSchedClusterOptions are the kyb-scheduler studies' cluster: the API
// server serves the Workload and PodGroup API, as on a cluster that runs
// gangs, so that kyb-scheduler runs as it ships, with gang scheduling on
// (it turns GenericWorkload off where the API is not served). The API
// server's gates are the process's: the in-process scheduler runs with
// GenericWorkload on too.
func KybSchedClusterOptions() harness.Options {
	return harness.Options{
		FeatureGates:   map[string]bool{"GenericWorkload": true},
		APIServerFlags: []string{"--runtime-config=scheduling.k8s.io/v1beta1=true"},
	}
}

// processConfig is a KubeSchedulerConfiguration for a scheduler process:
// its client at scheduler_perf's limits (QPS 5,000), as the in-process
// scheduler's; kube-scheduler's default of 50 would set the pace.
// profiles is the YAML list of profiles, "" for the binary's default.
func processConfig(kubeconfig, profiles string) string {
	cfg := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q, qps: 5000, burst: 5000}
leaderElection: {leaderElect: false}
`, kubeconfig)
	if profiles != "" {
		cfg += "profiles:\n" + profiles
	}
	return cfg
}

// noScoreProfile is kyb-scheduler's built-in profile without KybPlacement:
// kube-scheduler's default plugins, NodeResourcesFit scoring
// MostAllocated (cmd/kyb-scheduler/app.DefaultProfile).
const noScoreProfile = `- schedulerName: ` + kybSchedulerName + `
  pluginConfig:
  - name: NodeResourcesFit
    args: {scoringStrategy: {type: MostAllocated}}
`

// stockScheduler is stock kube-scheduler: opts.KubeScheduler as a process
// with its default plugins, or the cluster's in-process scheduler.
func stockScheduler(opts KybSchedOptions) schedulerUnderTest {
	if opts.KubeScheduler == "" {
		return schedulerUnderTest{Name: "stock kube-scheduler (in-process)", start: func(context.Context, *harness.Cluster, string) (schedTarget, func()) {
			return inProcessScheduler(), func() {}
		}}
	}
	return schedulerUnderTest{Name: "stock kube-scheduler", start: func(ctx context.Context, c *harness.Cluster, turn string) (schedTarget, func()) {
		return schedulerProcess(ctx, c, harness.KybSchedulerOptions{Binary: opts.KubeScheduler, Name: "stock-" + turn,
			Config: processConfig(c.Kubeconfig, "- schedulerName: "+stockSchedulerName+"\n")}, stockSchedulerName)
	}}
}

// kybScheduler is kyb-scheduler with its built-in profile (score on,
// pack), or, without score, its profile less KybPlacement.
func kybScheduler(opts KybSchedOptions, score bool) schedulerUnderTest {
	name, profiles := "kyb-scheduler (built-in profile: score on, pack)", ""
	if !score {
		name, profiles = "kyb-scheduler without the score", noScoreProfile
	}
	return kybSchedulerBinary(opts.KybScheduler, name, profiles)
}

// kybSchedulerBinary is the kyb-scheduler command bin under name, with
// profiles ("" for its built-in one).
func kybSchedulerBinary(bin, name, profiles string) schedulerUnderTest {
	return schedulerUnderTest{Name: name, start: func(ctx context.Context, c *harness.Cluster, turn string) (schedTarget, func()) {
		return schedulerProcess(ctx, c, harness.KybSchedulerOptions{Binary: bin, Name: "kyb-" + turn,
			Config: processConfig(c.Kubeconfig, profiles)}, kybSchedulerName)
	}}
}

// schedulerProcess starts a scheduler process and returns the target its
// pods name.
func schedulerProcess(ctx context.Context, c *harness.Cluster, o harness.KybSchedulerOptions, name string) (schedTarget, func()) {
	k := c.StartKybScheduler(o)
	return schedTarget{
		name:       name,
		attempts:   func(ctx context.Context) (map[string]float64, error) { return settledAttempts(ctx, k) },
		costs:      func(ctx context.Context) (cycleCosts, error) { return processCycleCosts(ctx, k.Metrics) },
		cpu:        func(ctx context.Context) (float64, error) { return processCPUSeconds(ctx, k.Metrics) },
		metrics:    k.Metrics,
		cpuProfile: k.CPUProfile,
	}, k.Stop
}

// settledAttempts reads a scheduler process's attempts once they have
// stopped changing: the process records an attempt after the binding our
// watch sees, so a page read at once misses the last pods' attempts.
func settledAttempts(ctx context.Context, k *harness.KybScheduler) (map[string]float64, error) {
	var last map[string]float64
	for range 10 {
		page, err := k.Metrics(ctx)
		if err != nil {
			return nil, err
		}
		cur, err := parseAttempts(page)
		if err != nil {
			return nil, err
		}
		if last != nil && maps.Equal(cur, last) {
			break
		}
		last = cur
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return last, nil
}

// parseAttempts reads scheduler_schedule_attempts_total by result from a
// Prometheus text page, summed over profiles.
func parseAttempts(page []byte) (map[string]float64, error) {
	out := map[string]float64{}
	err := scanSamples(page, func(name string, labels map[string]string, v float64) {
		if name == "scheduler_schedule_attempts_total" {
			out[labels["result"]] += v
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// createClasses creates the shapes' DeviceClasses, once per cluster.
func createClasses(ctx context.Context, c *harness.Cluster, shapes ...Shape) error {
	for _, s := range shapes {
		for _, dc := range s.Classes {
			if _, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create class %s: %w", dc.Name, err)
			}
		}
	}
	return nil
}
