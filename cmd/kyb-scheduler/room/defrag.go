package room

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	policy "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
)

// Mode is what defragmentation does.
type Mode string

const (
	// Off: nothing (the default).
	Off Mode = "off"
	// On: it evicts.
	On Mode = "on"
	// DryRun: it says what it would evict, in its log and in events, and
	// evicts nothing.
	DryRun Mode = "dry-run"
)

// Defragmentation is how kyb-scheduler moves pods to free whole groups:
// for a pod that waits for a group no node has free (Mode), and ahead of
// demand, once per Period, within EvictionsPerCycle evictions
// (consolidate.go). Its flags are kyb-scheduler's.
type Defragmentation struct {
	Mode Mode
	// Period between consolidations; 0: none.
	Period time.Duration
	// EvictionsPerCycle bounds a consolidation's evictions.
	EvictionsPerCycle int
}

// DefaultEvictionsPerCycle is a consolidation's disruption budget where
// none is given.
const DefaultEvictionsPerCycle = 2

// AddFlags adds the flags that set d.
func (d *Defragmentation) AddFlags(fs *pflag.FlagSet) {
	if d.Mode == "" {
		d.Mode = Off
	}
	if d.EvictionsPerCycle == 0 {
		d.EvictionsPerCycle = DefaultEvictionsPerCycle
	}
	fs.Var((*modeValue)(&d.Mode), "defragmentation", "Move pods to free whole GPU groups: off, on, or dry-run (log and events, no eviction). "+
		"A pod waiting for a group no node has free gets one where evicting the fewest movable pods of its priority or lower frees it, "+
		"each evicted pod having been checked to fit elsewhere (docs/kyb-scheduler.md, Defragmentation).")
	fs.DurationVar(&d.Period, "defragmentation-period", d.Period, "With --defragmentation, also consolidate once per period, ahead of demand: "+
		"free a whole group of the largest size where moving pods elsewhere does. 0: never.")
	fs.IntVar(&d.EvictionsPerCycle, "defragmentation-evictions-per-cycle", d.EvictionsPerCycle, "The most pods one consolidation evicts.")
}

// Validate says what is wrong with d.
func (d *Defragmentation) Validate() error {
	var errs []string
	switch d.Mode {
	case Off, On, DryRun, "":
	default:
		errs = append(errs, fmt.Sprintf("--defragmentation=%s: want off, on or dry-run", d.Mode))
	}
	if d.Period < 0 {
		errs = append(errs, fmt.Sprintf("--defragmentation-period=%v: must not be negative", d.Period))
	}
	if d.EvictionsPerCycle < 1 {
		errs = append(errs, fmt.Sprintf("--defragmentation-evictions-per-cycle=%d: must be at least 1", d.EvictionsPerCycle))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

type modeValue Mode

func (m *modeValue) String() string { return string(*m) }
func (m *modeValue) Type() string   { return "mode" }
func (m *modeValue) Set(s string) error {
	switch Mode(s) {
	case Off, On, DryRun:
		*m = modeValue(s)
		return nil
	}
	return fmt.Errorf("want off, on or dry-run")
}

// plan is a defragmentation for a waiting pod on a node: the pods to move,
// where each fits once recreated, and the devices the waiting pod gets.
type plan struct {
	node       string
	victims    []*v1.Pod
	moves      []move
	allocation []resourceapi.AllocationResult
	cost       cost
}

// defragment is the waiting pod's last resort, where preemption found no
// victims: on the nodes whose Filter rejected it for what evicting pods
// may resolve, the fewest movable pods (movable.go) of its priority or
// lower whose release lets the allocator place its claims (Search), each
// of which fits elsewhere once recreated (moves), all within their
// PodDisruptionBudgets. The best node (fewest pods, then the lowest
// priorities) is the pod's nominated node, and keeps the devices for it
// as a preemption's does while the moved pods go.
func (pl *Preemption) defragment(ctx context.Context, state fwk.CycleState, pod *v1.Pod, m fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	logger := klog.FromContext(ctx)
	if newChanges(state, pl.dra) == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, "defragmentation: the pod has no claim to allocate")
	}
	if p := pod.Spec.PreemptionPolicy; p != nil && *p == v1.PreemptNever {
		return nil, fwk.NewStatus(fwk.Unschedulable, "defragmentation: not for a pod with preemptionPolicy=Never")
	}
	best, err := pl.bestPlan(ctx, state, pod, m, corev1helpers.PodPriority(pod))
	if err != nil {
		return nil, fwk.AsStatus(fmt.Errorf("defragmentation: %w", err))
	}
	if best == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable, "defragmentation: no movable pods whose move frees room")
	}
	if pl.defrag.Mode == DryRun {
		pl.report(ctx, pod, best, true)
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("defragmentation (dry run): would move %s off node %s", names(best.victims), best.node))
	}
	pl.report(ctx, pod, best, false)
	evicted, err := pl.evictAll(ctx, pod, best)
	if len(evicted) == 0 {
		// Refused at once: nothing moves, the refused pod stays out of
		// the next plans for a while.
		return nil, fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("defragmentation: %v", err))
	}
	// The pods evicted are gone, whether or not all went: the pod waits
	// for them, nominated to the node, which keeps their devices for it
	// from their own replacements; the refused pod stays out of its next
	// plans, and it defragments again once they are gone.
	pl.underway.add(best.moves, evicted)
	pl.kept.set(pod, best.node, best.allocation, evicted, heldBy(pl.dra, evicted))
	logger.V(2).Info("Defragmented", "pod", klog.KObj(pod), "node", best.node, "moved", klog.KObjSlice(evicted), "err", err)
	if err != nil {
		return framework.NewPostFilterResultWithNominatedNode(best.node),
			fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("defragmentation: moved %d of %d pod(s) off node %s: %v", len(evicted), len(best.victims), best.node, err))
	}
	return framework.NewPostFilterResultWithNominatedNode(best.node),
		fwk.NewStatus(fwk.Success, fmt.Sprintf("defragmentation: moving %d pod(s) off node %s", len(best.victims), best.node))
}

// bestPlan is the best plan over the nodes the pod may go to once pods
// leave them: those Filter found Unschedulable (an allocator without room
// among them), not UnschedulableAndUnresolvable. Like preemption, it
// stops once it has plans on as many nodes as preemption would dry-run.
func (pl *Preemption) bestPlan(ctx context.Context, state fwk.CycleState, pod *v1.Pod, m fwk.NodeToStatusReader, priority int32) (*plan, error) {
	infos, err := pl.fh.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return nil, err
	}
	pdbs, err := pl.Evaluator.PdbLister.List(klabels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list PodDisruptionBudgets: %w", err)
	}
	offset, want := pl.GetOffsetAndNumCandidates(int32(len(infos)))
	var best *plan
	found := 0
	for i := range infos {
		ni := infos[(int(offset)+i)%len(infos)]
		if ni.Node() == nil || m.Get(ni.Node().Name).Code() != fwk.Unschedulable {
			continue
		}
		p, err := pl.planOn(ctx, state, pod, ni, pdbs, priority, nil)
		if err != nil {
			return nil, err
		}
		if p == nil {
			continue
		}
		found++
		if best == nil || p.cost.compare(best.cost) < 0 || (p.cost.compare(best.cost) == 0 && p.node < best.node) {
			best = p
		}
		if int32(found) >= want {
			break
		}
	}
	return best, nil
}

// planOn searches a node for the fewest movable pods (of priority at most
// priority) whose move frees room for pod there, each fitting elsewhere
// (on targets, where set), none violating a PodDisruptionBudget. Nil
// where there are none.
func (pl *Preemption) planOn(ctx context.Context, state fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo, pdbs []*policy.PodDisruptionBudget, priority int32, targets func(*room)) (*plan, error) {
	logger := klog.FromContext(ctx)
	node := ni.Node().Name
	c := newChanges(state, pl.dra)
	if c == nil {
		return nil, nil
	}
	// The waiting pod fits where the replacements of earlier moves leave
	// room.
	state = pl.withUnderway(state, pl.underway.list())
	var victims []*victim
	var units []Unit
	for _, pi := range ni.GetPods() {
		p := pi.GetPod()
		if corev1helpers.PodPriority(p) > priority || len(podClaims(pl.dra, p)) == 0 {
			continue
		}
		if ok, why := movable(pl.dra, pl.jobs, p); !ok {
			logger.V(5).Info("Not movable", "pod", klog.KObj(p), "reason", why)
			continue
		}
		if pl.refused.has(p.UID) {
			logger.V(5).Info("Not movable", "pod", klog.KObj(p), "reason", "its eviction was refused lately")
			continue
		}
		v, err := preemption.NewVictim([]fwk.PodInfo{pi}, corev1helpers.PodPriority(p), fwk.PodKeyType)
		if err != nil {
			return nil, err
		}
		victims = append(victims, &victim{Victim: v, nodes: map[string]fwk.NodeInfo{node: ni}})
		units = append(units, Unit{Pods: []*v1.Pod{p}, Priority: corev1helpers.PodPriority(p)})
	}
	if len(units) == 0 {
		return nil, nil
	}
	search, err := NewSearch(pl.dra, c.base, node, units)
	if err != nil {
		return nil, err
	}
	search.Violations = func(idx []int) int {
		violating, _ := preemption.FilterVictimsWithPDBViolation(pick(victims, idx), pdbs)
		return len(violating)
	}
	moves := map[string][]move{}
	search.Accept = func(ctx context.Context, idx []int, allocation []resourceapi.AllocationResult) (bool, error) {
		if search.Violations(idx) > 0 {
			return false, nil
		}
		r := room{node: node, waiting: pod, kept: allocation}
		for _, i := range idx {
			r.moved = append(r.moved, units[i].Pods...)
		}
		if targets != nil {
			targets(&r)
		}
		ms, ok, err := pl.moves(ctx, r)
		if ok {
			moves[key(idx)] = ms
		}
		return ok, err
	}
	fit := func(ctx context.Context, released []int) ([]resourceapi.AllocationResult, bool, error) {
		allocation, status := pl.fit(ctx, state, pod, ni, pick(victims, released))
		if status.IsSuccess() {
			return allocation, true, nil
		}
		if !status.IsRejected() {
			return nil, false, status.AsError()
		}
		return nil, false, nil
	}
	res, err := search.Run(ctx, fit)
	if err != nil || res == nil {
		return nil, err
	}
	p := &plan{node: node, allocation: res.Allocation, moves: moves[key(res.Victims)], cost: search.cost(res.Victims)}
	for _, i := range res.Victims {
		p.victims = append(p.victims, units[i].Pods...)
	}
	slices.SortFunc(p.victims, func(a, b *v1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	logger.V(4).Info("Defragmentation found room", "pod", klog.KObj(pod), "node", node, "moved", klog.KObjSlice(p.victims), "allocatorRuns", res.Fits)
	return p, nil
}

func names(pods []*v1.Pod) string {
	s := make([]string, len(pods))
	for i, p := range pods {
		s[i] = p.Namespace + "/" + p.Name
	}
	return strings.Join(s, ", ")
}
