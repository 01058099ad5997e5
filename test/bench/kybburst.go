package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

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
	// where some were not within the wait); the pods refused a node while
	// their seat was free (every pod has one), with the scheduler's
	// reason; the scheduler's unschedulable attempts after the release,
	// whatever the reason; and the pods left pending at the end of the
	// wait (each with a seat free for it).
	AllBound      []time.Duration
	Refused       []int
	Reasons       []string
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
	if err := parallel(ctx, len(nodes), func(i int) error { return createNode(ctx, c.Client, nodes[i], s, nil) }); err != nil {
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
	before, err := createUnschedulable(ctx, c, sched, s.Class, ns, id, pods)
	if err != nil {
		return err
	}
	refusals, stopRefusals, err := watchRefusals(c.Client, ns)
	if err != nil {
		return err
	}
	defer stopRefusals()
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
	refused, reason := refusals()
	res.Refused, res.Reasons = append(res.Refused, refused), append(res.Reasons, reason)
	res.Unschedulable = append(res.Unschedulable, after["unschedulable"]-before["unschedulable"])
	res.Pending = append(res.Pending, pods-bound)
	return nil
}

// watchRefusals counts the pods of ns that the scheduler finds
// unschedulable from now on for another reason than the node selector
// (before the release, or while it labels the nodes one by one, the
// selector is the reason), and returns the count and one such reason. A
// pod refused twice for the same reason is counted once: the scheduler
// writes a condition only where it changes.
func watchRefusals(client kubernetes.Interface, ns string) (func() (int, string), func(), error) {
	var mu sync.Mutex
	refused := map[string]bool{}
	reason := ""
	inf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	if _, err := inf.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, obj any) {
		pod, ok := obj.(*v1.Pod)
		if !ok {
			return
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable &&
				!strings.Contains(cond.Message, "node affinity/selector") {
				mu.Lock()
				refused[pod.Name], reason = true, cond.Message
				mu.Unlock()
			}
		}
	}}); err != nil {
		return nil, nil, fmt.Errorf("watch the pods of %s: %w", ns, err)
	}
	stop := make(chan struct{})
	inf.Start(stop)
	inf.WaitForCacheSync(stop)
	return func() (int, string) {
			mu.Lock()
			defer mu.Unlock()
			return len(refused), reason
		}, func() {
			close(stop)
			inf.Shutdown()
		}, nil
}

// Table summarises the study.
func (st *KybBurstStudy) Table() *Table {
	t := &Table{
		Title: fmt.Sprintf("A burst of %d one-seat pods onto a node's %d free 1x seats, the other %d nodes full: stock kube-scheduler against kyb-scheduler (%d rounds)",
			st.Seats, st.Seats, st.Options.BurstNodes-1, st.Options.Rounds),
		Header: []string{"scheduler", "all bound after (per round)", "pods refused while their seat was free (per round)",
			"unschedulable attempts after the release, any reason (per round)", "pods left pending with a seat free after " + fmt.Sprintf("%d s", st.Options.BurstWait)},
	}
	for _, r := range st.Results {
		var times, refused, unsched, pending []string
		for i := range r.AllBound {
			if r.AllBound[i] == 0 {
				times = append(times, "not within the wait")
			} else {
				times = append(times, Dur(r.AllBound[i]))
			}
			refused = append(refused, fmt.Sprint(r.Refused[i]))
			unsched = append(unsched, fmt.Sprintf("%.0f", r.Unschedulable[i]))
			pending = append(pending, fmt.Sprint(r.Pending[i]))
		}
		t.Rows = append(t.Rows, []string{r.Scheduler, strings.Join(times, ", "), strings.Join(refused, ", "), strings.Join(unsched, ", "), strings.Join(pending, ", ")})
	}
	for _, r := range st.Results {
		for i, reason := range r.Reasons {
			if reason != "" {
				t.Notes = append(t.Notes, fmt.Sprintf("%s, round %d, a refused pod's condition: %q", r.Scheduler, i+1, reason))
			}
		}
	}
	t.Notes = append([]string{fmt.Sprintf("The simulated %s node, configured with 8 1x seats per GPU (the prepare study's configuration), publishes %d 1x seats "+
		"(the 1x profile's seats, as the plugin plans them), in shared groups; the burst's "+
		"%d pods, each with its own claim for one 1x seat, are created unschedulable and released at once by labelling the nodes; the full nodes "+
		"are filled as in the throughput study. Every pod has a seat: a pod refused is one whose PodScheduled condition said Unschedulable, after the "+
		"release, for another reason than the node selector (every node considered, the empty one included). The unschedulable attempts "+
		"(scheduler_schedule_attempts_total{result=\"unschedulable\"}) also count a pod tried again before every node had its label. "+
		"Time from the release to the last pod bound. "+
		"The schedulers run as in the throughput study.", st.Options.Preset, st.Seats, st.Seats)}, t.Notes...)
	return t
}
