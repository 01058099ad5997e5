package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// The seat burst: one node's last free seats asked for at once, one pod
// per seat. Stock kube-scheduler's DRA plugin counts a share twice while
// it writes the share's claim (between the assume cache's update and the
// end of PreBind, docs/kyb-scheduler.md): a pod filtered in that window is
// refused a seat that is free, and waits for an event to retry it.
// kyb-scheduler's patch counts it once.

// KybBurstStudy is the burst's results per scheduler.
type KybBurstStudy struct {
	Options KybSchedOptions
	// Seats is how many 1x seats the preset's node has: the burst's pods,
	// and the free seats they are released onto.
	Seats   int
	Results []*KybBurstResult
}

// KybBurstResult is one scheduler's bursts.
type KybBurstResult struct {
	Scheduler string
	// Per round: the time from the release until every pod was bound (0
	// where some were not within the wait), the scheduler's unschedulable
	// attempts, and the pods left pending at the end of the wait (each
	// with a seat free for it: as many pods as free seats).
	AllBound      []time.Duration
	Unschedulable []float64
	Pending       []int
}

// RunKybBurst releases a node's seats' worth of one-seat pods onto a
// cluster of opts.BurstNodes nodes of our shape where every other node is
// full, under stock kube-scheduler and kyb-scheduler, taking turns.
func RunKybBurst(ctx context.Context, c *harness.Cluster, opts KybSchedOptions) (*KybBurstStudy, error) {
	// The node configuration of the prepare study: 8 1x seats per GPU, so
	// that the pods share groups, where the in-flight count matters.
	ours, err := KybShape(ctx, "ours ("+opts.Preset+", 8 seats per GPU)", opts.Preset, PrepareConfig, "1x")
	if err != nil {
		return nil, err
	}
	if err := createClasses(ctx, c, ours); err != nil {
		return nil, err
	}
	if opts.BurstNodes < 1 {
		return nil, fmt.Errorf("burst study: %d nodes, want at least 1", opts.BurstNodes)
	}
	st := &KybBurstStudy{Options: opts, Seats: ours.PerNode}
	scheds := []schedulerUnderTest{stockScheduler(opts), kybScheduler(opts, true)}
	for _, s := range scheds {
		st.Results = append(st.Results, &KybBurstResult{Scheduler: s.Name})
	}
	for round := 0; round < opts.Rounds; round++ {
		for k := range scheds {
			i := (k + round) % len(scheds)
			id := fmt.Sprintf("b%d-s%d", round, i)
			err := func() error {
				target, stop := scheds[i].start(ctx, c, id)
				defer stop()
				return burstRound(ctx, c, target, ours, id, opts, st.Results[i])
			}()
			if err != nil {
				return nil, fmt.Errorf("burst round %d, %s: %w", round, scheds[i].Name, err)
			}
		}
	}
	return st, nil
}

// burstRound makes opts.BurstNodes nodes, the last empty and the others
// full, creates one pod per seat of a node, releases them at once and
// waits for them up to opts.BurstWait.
func burstRound(ctx context.Context, c *harness.Cluster, sched schedTarget, s Shape, id string, opts KybSchedOptions, res *KybBurstResult) error {
	ns := "burst-" + id
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	nodes := make([]string, opts.BurstNodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-node-%03d", id, i)
	}
	if err := parallel(ctx, len(nodes), func(i int) error { return createNode(ctx, c.Client, nodes[i], s) }); err != nil {
		return err
	}
	defer removeRound(context.WithoutCancel(ctx), c.Client, ns, nodes)
	if err := fillNodes(ctx, c.Client, s, ns, nodes[:len(nodes)-1]); err != nil {
		return err
	}
	pods := s.PerNode
	scheduled, stop, err := watchScheduled(c.Client, ns, pods)
	if err != nil {
		return err
	}
	defer stop()
	if err := parallel(ctx, pods, func(i int) error {
		return createPod(ctx, c.Client, ns, fmt.Sprintf("p%04d", i), s.Class, id, sched.name)
	}); err != nil {
		return err
	}
	// Let the scheduler find every pod unschedulable first.
	time.Sleep(2 * time.Second)
	before, err := sched.attempts(ctx)
	if err != nil {
		return err
	}
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, schedLabel, id))
	released := time.Now()
	if err := parallel(ctx, len(nodes), func(i int) error {
		_, err := c.Client.CoreV1().Nodes().Patch(ctx, nodes[i], types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}); err != nil {
		return err
	}
	bound, last := 0, time.Time{}
	deadline := time.After(time.Duration(opts.BurstWait) * time.Second)
wait:
	for bound < pods {
		select {
		case t := <-scheduled:
			bound, last = bound+1, t
		case <-deadline:
			break wait
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	after, err := sched.attempts(ctx)
	if err != nil {
		return err
	}
	all := time.Duration(0)
	if bound == pods {
		all = last.Sub(released)
	}
	res.AllBound = append(res.AllBound, all)
	res.Unschedulable = append(res.Unschedulable, after["unschedulable"]-before["unschedulable"])
	res.Pending = append(res.Pending, pods-bound)
	return nil
}

// Table summarises the study.
func (st *KybBurstStudy) Table() *Table {
	t := &Table{
		Title: fmt.Sprintf("A burst of %d one-seat pods onto a node's %d free 1x seats, the other %d nodes full: stock kube-scheduler against kyb-scheduler (%d rounds)",
			st.Seats, st.Seats, st.Options.BurstNodes-1, st.Options.Rounds),
		Header: []string{"scheduler", "all bound after (per round)", "unschedulable attempts while seats were free (per round)", "pods left pending with a seat free after " + fmt.Sprintf("%d s", st.Options.BurstWait)},
	}
	for _, r := range st.Results {
		var times, unsched, pending []string
		for i := range r.AllBound {
			if r.AllBound[i] == 0 {
				times = append(times, "not within the wait")
			} else {
				times = append(times, Dur(r.AllBound[i]))
			}
			unsched = append(unsched, fmt.Sprintf("%.0f", r.Unschedulable[i]))
			pending = append(pending, fmt.Sprint(r.Pending[i]))
		}
		t.Rows = append(t.Rows, []string{r.Scheduler, strings.Join(times, ", "), strings.Join(unsched, ", "), strings.Join(pending, ", ")})
	}
	t.Notes = []string{fmt.Sprintf("The simulated %s node, configured with 8 1x seats per GPU (the prepare study's configuration), publishes %d 1x seats "+
		"(the 1x profile's seats, as the plugin plans them), in shared groups; the burst's "+
		"%d pods, each with its own claim for one 1x seat, are created unschedulable and released at once by labelling the nodes; the full nodes "+
		"are filled as in the throughput study. Every pod has a seat: an unschedulable attempt is a pod refused while a seat was free for it. "+
		"Time from the release to the last pod bound; attempts from the scheduler's scheduler_schedule_attempts_total{result=\"unschedulable\"}. "+
		"The schedulers run as in the throughput study.", st.Options.Preset, st.Seats, st.Seats)}
	return t
}
