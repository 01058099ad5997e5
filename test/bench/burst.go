package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-dra-plugin/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// The burst study: a node's pods all prepared at once through the kubelet,
// with the API rate limits the plugin ships with, ours against the no-op
// driver at the same prepare-path limits. The prepare study runs both at
// QPS 1000 to measure our own work; this one measures what the limits add.

// BurstOptions size the burst study.
type BurstOptions struct {
	// Sizes are the pods prepared at once.
	Sizes  []int
	Rounds int
	// ShippedOnly leaves out the limits the plugin no longer ships.
	ShippedOnly bool
}

// BurstGoal: a 32-pod burst prepared within 1.2x of the no-op driver at
// the shipped defaults.
const (
	BurstGoal     = 1.2
	BurstGoalPods = 32
)

// burstConfig is one set of limits measured.
type burstConfig struct {
	name    string
	limits  Limits
	shipped bool
}

func burstConfigs() []burstConfig {
	return []burstConfig{
		{name: "one client, QPS 5 / burst 10 (shipped until now)", limits: Limits{QPS: 5, Burst: 10}},
		{name: "prepare QPS 5 / burst 10, background QPS 5 / burst 10", limits: Limits{QPS: 5, Burst: 10, BackgroundQPS: 5, BackgroundBurst: 10}},
		{name: fmt.Sprintf("prepare QPS %d / burst %d, background QPS %d / burst %d (shipped)", app.DefaultPrepareQPS, app.DefaultPrepareBurst, app.DefaultBackgroundQPS, app.DefaultBackgroundBurst),
			limits: Limits{QPS: app.DefaultPrepareQPS, Burst: app.DefaultPrepareBurst, BackgroundQPS: app.DefaultBackgroundQPS, BackgroundBurst: app.DefaultBackgroundBurst}, shipped: true},
	}
}

// BurstResult is one driver's bursts of one size under one config.
type BurstResult struct {
	Config, Driver string
	Shipped        bool
	Size           int
	// Samples are every pod's prepare latency; Last the slowest of each
	// burst: when the node's last pod could start.
	Samples, Last []time.Duration
	// Requests are the API requests made while the bursts ran, by client
	// and verb; Background those of our background client until the
	// next burst.
	Requests, Background map[string]int
}

// BurstStudy is the study's results.
type BurstStudy struct {
	Options BurstOptions
	Results []BurstResult
}

// RunBurst measures every config, a node each, rounds times every size,
// the drivers taking turns.
func RunBurst(ctx context.Context, c *harness.Cluster, opts BurstOptions) (*BurstStudy, error) {
	st := &BurstStudy{Options: opts}
	for i, cfg := range burstConfigs() {
		if opts.ShippedOnly && !cfg.shipped {
			continue
		}
		e, err := newPrepareEnv(ctx, c, fmt.Sprintf("burst-node-%d", i), cfg.limits)
		if err != nil {
			return nil, err
		}
		// A node's first pods come after the plugin has started, published
		// its slices (through the helper's client, the prepare path's) and
		// its limiter has refilled.
		time.Sleep(time.Duration(float64(cfg.limits.Burst)/float64(cfg.limits.QPS)*float64(time.Second)) + time.Second)
		err = func() error {
			defer e.ours.Stop()
			defer e.noop.Stop()
			for _, n := range opts.Sizes {
				res := map[string]*BurstResult{}
				for _, drv := range []string{driver.Name, NoopDriver} {
					res[drv] = &BurstResult{Config: cfg.name, Driver: drv, Shipped: cfg.shipped, Size: n, Requests: map[string]int{}, Background: map[string]int{}}
				}
				for r := range opts.Rounds {
					order := []string{driver.Name, NoopDriver}
					if r%2 == 1 {
						slices.Reverse(order)
					}
					for _, drv := range order {
						if err := e.burst(ctx, drv, n, res[drv]); err != nil {
							return fmt.Errorf("%s, %d pods, %s: %w", cfg.name, n, drv, err)
						}
					}
				}
				st.Results = append(st.Results, *res[driver.Name], *res[NoopDriver])
			}
			return nil
		}()
		if err != nil {
			return nil, err
		}
	}
	return st, nil
}

// burst prepares n pods' claims of drv at once through the kubelet.
func (e *prepareEnv) burst(ctx context.Context, drv string, n int, res *BurstResult) error {
	claims, err := e.claims(ctx, drv, n)
	if err != nil {
		return err
	}
	e.requests.take()
	samples, err := e.prepareAtOnce(ctx, PathKubelet, drv, claims)
	if err != nil {
		return err
	}
	for k, v := range e.requests.take() {
		res.Requests[k] += v
	}
	res.Samples = append(res.Samples, samples...)
	res.Last = append(res.Last, slices.Max(samples))
	// The statuses of the burst, written behind it, are counted before the
	// pods go: a node's pods run for longer than that. The no-op driver
	// writes nothing behind.
	if drv != driver.Name {
		return e.done(ctx, PathKubelet, drv, claims, settle)
	}
	time.Sleep(time.Duration(float64(n)/float64(e.limits.background())*float64(time.Second)) + 2*time.Second)
	for k, v := range e.requests.take() {
		res.Background[k] += v
	}
	return e.done(ctx, PathKubelet, drv, claims, settle)
}

// Table is the study's table.
func (st *BurstStudy) Table() *Table {
	t := &Table{
		Title: fmt.Sprintf("Prepare bursts through the kubelet at the plugin's API rate limits: ours vs the no-op driver at the same prepare-path limits (%d rounds)", st.Options.Rounds),
		Header: []string{"limits", "pods at once", "ours p50", "ours: last pod", "no-op p50", "no-op: last pod", "ratio (last pod)", "goal ≤ 1.2x",
			"API requests per pod during the burst: ours / no-op", "ours behind it (statuses, events)"},
	}
	for i := 0; i+1 < len(st.Results); i += 2 {
		o, n := st.Results[i], st.Results[i+1]
		ratio := float64(MedianDuration(o.Last)) / float64(MedianDuration(n.Last))
		goal := ""
		if o.Shipped && o.Size == BurstGoalPods {
			goal = Verdict(ratio <= BurstGoal)
		}
		pods := float64(o.Size * len(o.Last))
		t.Rows = append(t.Rows, []string{o.Config, fmt.Sprint(o.Size),
			Dur(Percentile(o.Samples, 50)), Dur(MedianDuration(o.Last)), Dur(Percentile(n.Samples, 50)), Dur(MedianDuration(n.Last)), Ratio(ratio), goal,
			fmt.Sprintf("%.2f / %.2f (%s)", float64(sum(o.Requests))/pods, float64(sum(n.Requests))/pods, perPod(o.Requests, pods)),
			fmt.Sprintf("%.2f (%s)", float64(sum(o.Background))/pods, perPod(o.Background, pods))})
	}
	t.Notes = []string{"Each pod has one claim of one 1x seat; the pods of a burst are handed to the kubelet's DRA manager at once. " +
		"Last pod: when the burst's slowest prepare returned (median over rounds). Requests: every API request of the driver's clients while the burst ran " +
		"(ours: the helper's claim GET and anything else on the prepare path; no-op: the helper's claim GET), then ours behind it until the statuses are written."}
	return t
}

// perPod lists counts by client and verb, per pod.
func perPod(m map[string]int, pods float64) string {
	keys := slices.Sorted(maps.Keys(m))
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(m[k])/pods))
	}
	return strings.Join(parts, ", ")
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
