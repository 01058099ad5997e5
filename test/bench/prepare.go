package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// PrepareOptions shape the prepare latency study.
type PrepareOptions struct {
	// Concurrent is how many claims are prepared at once (one call each).
	Concurrent int
	// Single is how many one-claim calls are made one after the other,
	// holding their claims; Passes is how many times that is done (the
	// claims unprepared between passes), so that a p99 rests on
	// Single*Passes samples and not on the slowest of a few.
	Single, Passes int
	// Bursts is how many times Concurrent claims are prepared at once in
	// a round; their p99 is over all bursts' samples.
	Bursts int
	// Rounds of the whole study; figures are medians over rounds.
	Rounds int
	// QPS and Burst are both drivers' client-side API rate limits.
	QPS   float32
	Burst int
	// BackgroundQPS and BackgroundBurst limit our plugin's background
	// client (claim statuses, events); zero means QPS and Burst. Set low,
	// they keep our writes behind the calls off the API server that
	// shares this machine while the calls are timed.
	BackgroundQPS   float32
	BackgroundBurst int
}

// Path is how a prepare reaches the driver.
type Path string

const (
	// PathSocket is NodePrepareResources straight on the driver's socket.
	PathSocket Path = "socket"
	// PathKubelet is the kubelet's DRA manager's PrepareResources for a pod.
	PathKubelet Path = "kubelet"
)

// Latency is one scenario's latencies for one driver in one round.
type Latency struct {
	Path       Path
	Driver     string
	Concurrent int
	Samples    []time.Duration
	// Batches is how many batches our plugin prepared the claims of all
	// Passes in.
	Batches, Passes int
}

// PrepareStudy holds every round's latencies and our plugin's steps.
type PrepareStudy struct {
	Options PrepareOptions
	Rounds  [][]Latency
	// CDIOnTmpfs says whether our plugin wrote its CDI specs to a tmpfs,
	// as on a node, or to the machine's disk (no tmpfs here).
	CDIOnTmpfs bool
	// Steps are the mean durations of our prepare's steps over the
	// one-claim socket calls of all rounds.
	Steps []Step
}

// Step is one part of our prepare.
type Step struct {
	Name           string
	Mean, P50, P99 time.Duration
}

// RunPrepare measures prepare latency of our driver and the no-op driver
// on one node of a running cluster.
func RunPrepare(ctx context.Context, c *harness.Cluster, opts PrepareOptions) (*PrepareStudy, error) {
	e, err := newPrepareEnv(ctx, c, "bench-node", Limits{QPS: opts.QPS, Burst: opts.Burst, BackgroundQPS: cmp.Or(opts.BackgroundQPS, opts.QPS), BackgroundBurst: cmp.Or(opts.BackgroundBurst, opts.Burst)})
	if err != nil {
		return nil, err
	}
	defer e.ours.Stop()
	defer e.noop.Stop()
	if e.cdiOnTmpfs {
		defer os.RemoveAll(e.cdiRoot)
	}
	study := &PrepareStudy{Options: opts, CDIOnTmpfs: e.cdiOnTmpfs}
	var steps []map[string]time.Duration
	for r := 0; r < opts.Rounds; r++ {
		var round []Latency
		for _, path := range []Path{PathSocket, PathKubelet} {
			for _, n := range []int{1, opts.Concurrent} {
				ls, s, err := e.measurePair(ctx, path, n, r, opts)
				if err != nil {
					return nil, fmt.Errorf("round %d, %s, %d at once: %w", r, path, n, err)
				}
				round = append(round, ls...)
				steps = append(steps, s...)
			}
		}
		study.Rounds = append(study.Rounds, round)
	}
	study.Steps = meanSteps(steps)
	return study, nil
}

// settle is the pause after every burst: longer than our plugin's delays
// of its background work (claim status writes after 1 s, one slice
// publish per 0.5 s of changes), so that the next pass starts on a quiet
// machine. The no-op driver's passes get the same pause: the kubelet's
// own work and the garbage of a pass of either driver outlast it, and a
// pass that started on the heels of another would pay for it.
const settle = 3 * time.Second

// passSettle is the pause after every pass of one-claim calls: just past
// those delays.
const passSettle = 1500 * time.Millisecond

// measurePair measures both drivers on one path and concurrency, taking
// turns pass by pass (burst by burst), the first driver alternating, so
// that both see the same machine: on a shared machine the noise of a
// minute is larger than the difference measured. Each driver's samples are
// pooled over its passes.
func (e *prepareEnv) measurePair(ctx context.Context, path Path, n, round int, opts PrepareOptions) ([]Latency, []map[string]time.Duration, error) {
	ls := map[string]*Latency{}
	drivers := []string{driver.Name, NoopDriver}
	passes := max(opts.Passes, 1)
	if n > 1 {
		passes = max(opts.Bursts, 1)
	}
	for _, drv := range drivers {
		ls[drv] = &Latency{Path: path, Driver: drv, Concurrent: n, Passes: passes}
	}
	var steps []map[string]time.Duration
	e.steps.batches()
	for p := range passes {
		order := drivers
		if (round+p)%2 == 1 {
			order = []string{drivers[1], drivers[0]}
		}
		for _, drv := range order {
			samples, s, err := e.measurePass(ctx, path, drv, n, opts.Single)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", drv, err)
			}
			ls[drv].Samples = append(ls[drv].Samples, samples...)
			if drv == driver.Name {
				steps = append(steps, s...)
				ls[drv].Batches += e.steps.batches()
			}
		}
	}
	return []Latency{*ls[drivers[0]], *ls[drivers[1]]}, steps, nil
}

// measurePass prepares claims of driver through path: single one-claim
// calls one after the other when n is 1, else n one-claim calls at once;
// then unprepares them (not measured) and lets the driver's background
// work finish.
func (e *prepareEnv) measurePass(ctx context.Context, path Path, driverName string, n, single int) ([]time.Duration, []map[string]time.Duration, error) {
	if n == 1 {
		var samples []time.Duration
		var steps []map[string]time.Duration
		claims, err := e.claims(ctx, driverName, single)
		if err != nil {
			return nil, nil, err
		}
		for _, bc := range claims {
			e.steps.reset()
			start := time.Now()
			if err := e.prepare(ctx, path, driverName, bc); err != nil {
				return nil, nil, err
			}
			end := time.Now()
			samples = append(samples, end.Sub(start))
			if path == PathSocket && driverName == driver.Name {
				steps = append(steps, stepDurations(start, e.steps.reset(), end))
			}
		}
		return samples, steps, e.done(ctx, path, driverName, claims, passSettle)
	}
	claims, err := e.claims(ctx, driverName, n)
	if err != nil {
		return nil, nil, err
	}
	samples, err := e.prepareAtOnce(ctx, path, driverName, claims)
	if err != nil {
		return nil, nil, err
	}
	return samples, nil, e.done(ctx, path, driverName, claims, settle)
}

// prepareAtOnce prepares every claim at once, a call each, started
// together, and returns each call's latency.
func (e *prepareEnv) prepareAtOnce(ctx context.Context, path Path, driverName string, claims []*benchClaim) ([]time.Duration, error) {
	samples := make([]time.Duration, len(claims))
	errs := make([]error, len(claims))
	var ready, done sync.WaitGroup
	gate := make(chan struct{})
	for i, bc := range claims {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			start := time.Now()
			errs[i] = e.prepare(ctx, path, driverName, bc)
			samples[i] = time.Since(start)
		}()
	}
	ready.Wait()
	close(gate)
	done.Wait()
	return samples, errorsJoin(errs)
}

// done unprepares a scenario's claims (not measured), frees their seats in
// the allocator, and lets background work (our claim status writes) finish
// before the next measurement: on this machine the API server shares the
// CPUs.
func (e *prepareEnv) done(ctx context.Context, path Path, driverName string, claims []*benchClaim, pause time.Duration) error {
	if err := e.unprepare(ctx, path, driverName, claims); err != nil {
		return err
	}
	e.release(claims)
	time.Sleep(pause)
	return nil
}

func (e *prepareEnv) prepare(ctx context.Context, path Path, driverName string, bc *benchClaim) error {
	if path == PathKubelet {
		return e.node.DRAManager().PrepareResources(ctx, bc.pod)
	}
	resp, err := e.conns[driverName].NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claimRef(bc)}})
	if err != nil {
		return err
	}
	return checkPrepared(resp, bc)
}

func (e *prepareEnv) unprepare(ctx context.Context, path Path, driverName string, claims []*benchClaim) error {
	if path == PathKubelet {
		for _, bc := range claims {
			if err := e.node.DRAManager().UnprepareResources(ctx, bc.pod); err != nil {
				return err
			}
		}
		return nil
	}
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, bc := range claims {
		req.Claims = append(req.Claims, claimRef(bc))
	}
	resp, err := e.conns[driverName].NodeUnprepareResources(ctx, req)
	if err != nil {
		return err
	}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			return fmt.Errorf("unprepare %s: %s", uid, r.Error)
		}
	}
	return nil
}

// stepDurations splits one prepare call into its steps by the times our
// plugin passed its hook points. The claim status write and the fsync of
// the checkpoint happen behind the call and are not part of it.
func stepDurations(start time.Time, at map[draplugin.HookPoint]time.Time, end time.Time) map[string]time.Duration {
	seq := []struct {
		name string
		at   time.Time
	}{
		{stepOrder[0], at[draplugin.HookPrepareStart]},
		{stepOrder[1], at[draplugin.HookBeforeSave]},
		{stepOrder[2], at[draplugin.HookAfterSave]},
		{stepOrder[3], at[draplugin.HookAfterCDIWrite]},
		{stepOrder[4], end},
	}
	out := map[string]time.Duration{}
	prev := start
	for _, s := range seq {
		if s.at.Before(start) || s.at.After(end) {
			continue
		}
		out[s.name] = s.at.Sub(prev)
		prev = s.at
	}
	out[stepOrder[len(stepOrder)-1]] = end.Sub(start)
	return out
}

// stepOrder names the steps of a prepare call.
var stepOrder = []string{
	"gRPC + helper's claim GET", "batch wait + seat choice", "checkpoint save (rename; fsync behind the call)", "CDI spec write",
	"reply", "total",
}

func meanSteps(all []map[string]time.Duration) []Step {
	var out []Step
	for _, name := range stepOrder {
		var ds []time.Duration
		for _, m := range all {
			if d, ok := m[name]; ok {
				ds = append(ds, d)
			}
		}
		if len(ds) > 0 {
			out = append(out, Step{Name: name, Mean: Mean(ds), P50: Percentile(ds, 50), P99: Percentile(ds, 99)})
		}
	}
	return out
}
