package room

import (
	"context"
	"fmt"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	policy "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/utils/clock"
)

// Name is the plugin's name in the scheduler's configuration.
const Name = "KybPreemption"

// Preemption is kube-scheduler's DefaultPreemption with a victim search
// that frees devices: for a pod whose claims the allocator must allocate,
// a node's victims are the fewest lower-priority pods (a gang whole)
// whose release lets the allocator allocate them there (Search), and its
// PreFilterExtensions release a removed pod's claims for the
// DynamicResources plugin's Filter and keep the devices of the pod a
// preemption nominated to a node from lower-priority pods. Everything
// else is DefaultPreemption's: who may preempt whom, the nodes it
// dry-runs, PodDisruptionBudgets, the eviction and the nomination. Pods
// without claims to allocate get DefaultPreemption's search.
type Preemption struct {
	*defaultpreemption.DefaultPreemption
	fh   fwk.Handle
	dra  fwk.SharedDRAManager
	pods corelisters.PodLister
	// jobs tells whether a Job replaces its evicted pod (movable.go);
	// nil where defragmentation is off.
	jobs batchlisters.JobLister
	kept *keptDevices
	// underway are the moves of earlier defragmentations (underway.go).
	underway *movesUnderway
	// refused are the pods whose eviction was refused lately (evict.go).
	refused *refusals
	// gang is the release of a pod group preemption's dry run (gang.go).
	gang *gangRelease
	// wakes are the preemptors to try again once their preemption ends.
	wakes *wakes
	// evict is the executor's eviction of a victim; a pod group's
	// preemption evicts in its cycle, and wakes nothing.
	evict func(context.Context, preemption.Candidate, preemption.ExecutorPreemptor, *v1.Pod, string) (bool, error)
	// defrag is how the plugin moves pods where preemption finds no
	// victims (defrag.go).
	defrag Defragmentation
	// consolidation is when the next consolidation is due (consolidate.go).
	consolidation *consolidation
}

var (
	_ fwk.PreFilterPlugin          = &Preemption{}
	_ fwk.PreFilterExtensions      = &Preemption{}
	_ fwk.PostFilterPlugin         = &Preemption{}
	_ fwk.ReservePlugin            = &Preemption{}
	_ fwk.PodGroupPostFilterPlugin = &Preemption{}
	_ fwk.SignPlugin               = &Preemption{}
	_ preemption.Interface         = &Preemption{}
)

// Factory is the plugin's factory, for app.WithPlugin, with the process's
// feature gates and no defragmentation.
func Factory(ctx context.Context, obj runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
	return New(ctx, obj, fh, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate), Defragmentation{Mode: Off})
}

// FactoryWith is Factory with the defragmentation d says, read when the
// scheduler makes its plugins (after the command line is parsed).
func FactoryWith(d *Defragmentation) frameworkruntime.PluginFactory {
	return func(ctx context.Context, obj runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
		return New(ctx, obj, fh, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate), *d)
	}
}

// New returns the plugin.
func New(ctx context.Context, obj runtime.Object, fh fwk.Handle, fts feature.Features, d Defragmentation) (*Preemption, error) {
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	if d.Mode == "" {
		d.Mode = Off
	}
	if d.EvictionsPerCycle == 0 {
		d.EvictionsPerCycle = DefaultEvictionsPerCycle
	}
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	dp, err := defaultpreemption.New(ctx, args, fh, fts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	dra := fh.SharedDRAManager()
	if dra == nil {
		return nil, fmt.Errorf("%s needs the scheduler's DRA manager: is the DynamicResourceAllocation feature gate off?", Name)
	}
	pl := &Preemption{
		DefaultPreemption: dp, fh: fh, dra: dra,
		pods:     fh.SharedInformerFactory().Core().V1().Pods().Lister(),
		kept:     newKeptDevices(),
		underway: &movesUnderway{},
		refused:  &refusals{},
		gang:     &gangRelease{},
		wakes:    &wakes{waiting: sets.New[types.UID]()},
		defrag:   d,
	}
	if d.Mode != Off {
		pl.jobs = fh.SharedInformerFactory().Batch().V1().Jobs().Lister()
	}
	if d.Mode != Off && d.Period > 0 {
		pl.consolidation = &consolidation{period: d.Period, clock: clock.RealClock{}}
	}
	// The evaluator runs DefaultPreemption's preemption with this
	// plugin's search and node order.
	dp.Evaluator = preemption.NewEvaluator(Name, fh, pl, dp.Executor)
	pl.evict = dp.Executor.PreemptPod
	if fts.EnableAsyncPreemption {
		dp.Executor.PreemptPod = func(ctx context.Context, c preemption.Candidate, preemptor preemption.ExecutorPreemptor, victim *v1.Pod, plugin string) (bool, error) {
			inMemory, err := pl.evict(ctx, c, preemptor, victim, plugin)
			if err == nil {
				pl.wakes.after(ctx, pl, preemptor)
			}
			return inMemory, err
		}
	}
	return pl, nil
}

// Factory is also usable where a registry wants the older signature.
var _ frameworkruntime.PluginFactory = Factory

// Name returns the plugin's name.
func (pl *Preemption) Name() string { return Name }

// SignPod adds nothing to a pod's signature: the plugin changes no
// pod's feasibility but through the nominated pods, which the framework
// accounts for every pod alike.
func (pl *Preemption) SignPod(context.Context, *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return nil, nil
}

// PreFilter has nothing to check. It runs so that the framework calls the
// plugin's AddPod and RemovePod for the pod (a plugin that skips PreFilter
// is skipped there too), and, within a pod group preemption's dry run,
// releases the victims' claims for the group's pods (gang.go). Where a
// consolidation is due, it runs first (consolidate.go).
func (pl *Preemption) PreFilter(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if pl.consolidation != nil && pl.consolidation.due() {
		if n, err := pl.consolidate(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Consolidation failed")
		} else if n > 0 {
			klog.FromContext(ctx).V(2).Info("Consolidated", "evicted", n)
		}
	}
	cs.Write(scopeKey, &scope{dra: pl.dra})
	pl.gang.apply(cs, pod, pl.dra)
	return nil, nil
}

// PreFilterExtensions are AddPod and RemovePod.
func (pl *Preemption) PreFilterExtensions() fwk.PreFilterExtensions { return pl }

// RemovePod releases, for the cycle's Filter, the claims that only the
// removed pods use (preemption's dry run removes its candidate victims).
func (pl *Preemption) RemovePod(_ context.Context, cs fwk.CycleState, _ *v1.Pod, podInfoToRemove fwk.PodInfo, _ fwk.NodeInfo) *fwk.Status {
	c := newChanges(cs, pl.dra)
	pod := podInfoToRemove.GetPod()
	if c == nil || len(podClaims(pl.dra, pod)) == 0 {
		return nil
	}
	c.without(pod).write(cs)
	return nil
}

// AddPod gives a removed pod its claims back; for a nominated pod that
// Filter adds to its node (the framework adds those of the priority of
// the pod it filters and above), it takes the devices the preemption
// that nominated it found for it, so that no pod of a lower or the same
// priority takes them while its victims terminate.
func (pl *Preemption) AddPod(_ context.Context, cs fwk.CycleState, _ *v1.Pod, podInfoToAdd fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	c := newChanges(cs, pl.dra)
	if c == nil {
		return nil
	}
	pod := podInfoToAdd.GetPod()
	if _, removed := c.removed[pod.UID]; removed {
		c.with(pod, nil).write(cs)
		return nil
	}
	if allocation, ok := pl.kept.get(pod.UID, nodeInfo.Node().Name); ok {
		c.with(pod, allocation).write(cs)
	}
	return nil
}

// Reserve notes, in a pod group preemption's dry run, the node a pod of
// the group is reserved on: the devices Filter found for it there are
// then its, for the group's next pods (gang.go).
func (pl *Preemption) Reserve(_ context.Context, _ fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	pl.gang.reserve(pod.UID, node)
	return nil
}

// Unreserve forgets what Reserve noted.
func (pl *Preemption) Unreserve(_ context.Context, _ fwk.CycleState, pod *v1.Pod, _ string) {
	pl.gang.unreserve(pod.UID)
}

// PostFilter is DefaultPreemption's, with this plugin's search; where it
// nominates the pod to a node, the devices its search found for the pod
// there are kept for it (AddPod).
func (pl *Preemption) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, m fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	pl.kept.prune(pl.pods)
	pl.underway.prune(pl.pods)
	found := &foundData{byNode: map[string]foundOnNode{}}
	state.Write(foundKey, found)
	ctx = withGathered(ctx, state)
	result, status := pl.DefaultPreemption.PostFilter(ctx, state, pod, m)
	if status.IsSuccess() && result != nil && result.NominatingInfo != nil && result.NominatedNodeName != "" {
		if f, ok := found.get(result.NominatedNodeName); ok {
			pl.kept.set(pod, result.NominatedNodeName, f.allocation, f.victims, heldBy(pl.dra, f.victims))
		}
	}
	if pl.defrag.Mode != Off && noCandidates(result, status) {
		r, s := pl.defragment(ctx, state, pod, m)
		if s.IsSuccess() || !s.IsRejected() || r != nil {
			return r, s
		}
		return result, fwk.NewStatus(status.Code(), status.Message()+"; "+s.Message())
	}
	return result, status
}

// noCandidates says whether preemption ended for want of victims, the
// pod being eligible: it then clears the pod's nominated node. Where the
// pod was not eligible (its policy, or the victims of its last preemption
// or defragmentation still leaving) it returns no result.
func noCandidates(result *fwk.PostFilterResult, status *fwk.Status) bool {
	return status.Code() == fwk.Unschedulable && result != nil && result.NominatingInfo != nil && result.NominatedNodeName == ""
}

// foundKey holds what the searches of a PostFilter found, by node
// (SelectVictimsOnNode runs on clones of the cycle state).
const foundKey fwk.StateKey = Name + "/found"

type foundData struct {
	mu     sync.Mutex
	byNode map[string]foundOnNode
}

type foundOnNode struct {
	allocation []resourceapi.AllocationResult
	victims    []*v1.Pod
}

func (d *foundData) Clone() fwk.StateData { return d }

func (d *foundData) set(node string, f foundOnNode) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.byNode[node] = f
}

func (d *foundData) get(node string) (foundOnNode, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, ok := d.byNode[node]
	return f, ok
}

// SelectVictimsOnNode finds the fewest victims on a node (Search) for a
// pod with claims to allocate, DefaultPreemption's otherwise. The victims
// are the lower-priority pods DefaultPreemption would consider, a gang's
// pods as one (gang.go); each set the search proposes is judged by every
// Filter plugin, the allocator among them, with exactly that set removed
// (its claims released where no staying pod uses them).
func (pl *Preemption) SelectVictimsOnNode(ctx context.Context, state fwk.CycleState, preemptor *v1.Pod, nodeInfo fwk.NodeInfo,
	allPossibleVictims []*preemption.DomainVictim, pdbs []*policy.PodDisruptionBudget) ([]*v1.Pod, int, *fwk.Status) {
	c := newChanges(state, pl.dra)
	if c == nil {
		return pl.DefaultPreemption.SelectVictimsOnNode(ctx, state, preemptor, nodeInfo, allPossibleVictims, pdbs)
	}
	logger := klog.FromContext(ctx)
	node := nodeInfo.Node().Name
	victims := pl.victims(preemptor, allPossibleVictims)
	if len(victims) == 0 {
		return nil, 0, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "No preemption victims found for incoming pod")
	}
	units := make([]Unit, len(victims))
	for i, v := range victims {
		units[i] = Unit{Pods: podsOf(v), Priority: v.Priority()}
	}
	search, err := NewSearch(pl.dra, c.base, node, units)
	if err != nil {
		return nil, 0, fwk.AsStatus(err)
	}
	search.Violations = func(idx []int) int {
		violating, _ := preemption.FilterVictimsWithPDBViolation(pick(victims, idx), pdbs)
		n := 0
		for _, v := range violating {
			n += v.ViolateCount
		}
		return n
	}
	var filterStatus *fwk.Status
	fit := func(ctx context.Context, released []int) ([]resourceapi.AllocationResult, bool, error) {
		allocation, status := pl.fit(ctx, state, preemptor, nodeInfo, pick(victims, released))
		if status.IsSuccess() {
			return allocation, true, nil
		}
		if !status.IsRejected() {
			return nil, false, status.AsError()
		}
		filterStatus = status
		return nil, false, nil
	}
	res, err := search.Run(ctx, fit)
	if err != nil {
		return nil, 0, fwk.AsStatus(err)
	}
	if res == nil {
		return nil, 0, filterStatus
	}
	var pods []*v1.Pod
	for _, i := range res.Victims {
		pods = append(pods, units[i].Pods...)
	}
	if d, err := state.Read(foundKey); err == nil {
		d.(*foundData).set(node, foundOnNode{allocation: res.Allocation, victims: pods})
	}
	logger.V(4).Info("Victims found on node", "pod", klog.KObj(preemptor), "node", node, "victims", klog.KObjSlice(pods), "allocatorRuns", res.Fits)
	return pods, res.Violations, nil
}

// fit runs the Filter plugins for the preemptor on the node with the
// victims removed, as DefaultPreemption's dry run does (nominated pods of
// its priority and above included), and returns what the DynamicResources
// plugin's allocator gave its claims there.
func (pl *Preemption) fit(ctx context.Context, state fwk.CycleState, preemptor *v1.Pod, nodeInfo fwk.NodeInfo, victims []*victim) ([]resourceapi.AllocationResult, *fwk.Status) {
	logger := klog.FromContext(ctx)
	s := state.Clone()
	main := nodeInfo.Snapshot()
	node := main.Node().Name
	record := newAllocationRecord()
	c := newChanges(s, pl.dra)
	c.recording(record).write(s)
	for _, v := range victims {
		for name, other := range v.nodes {
			if name == node {
				other = main
			}
			for _, pi := range v.Pods() {
				if pi.GetPod().Spec.NodeName != name {
					continue
				}
				if name == node {
					if err := main.RemovePod(logger, pi.GetPod()); err != nil {
						return nil, fwk.AsStatus(err)
					}
				}
				if status := pl.fh.RunPreFilterExtensionRemovePod(ctx, s, preemptor, pi, other); !status.IsSuccess() {
					return nil, status
				}
			}
		}
	}
	status := pl.fh.RunFilterPluginsWithNominatedPods(ctx, s, preemptor, main)
	if !status.IsSuccess() {
		return nil, status
	}
	allocation, _ := record.get(node)
	return allocation, nil
}

// victims are the candidates DefaultPreemption would consider: of a lower
// priority than the preemptor and eligible on every node they run on;
// the pods of a gang are one candidate (gang.go).
func (pl *Preemption) victims(preemptor *v1.Pod, all []*preemption.DomainVictim) []*victim {
	priority := corev1helpers.PodPriority(preemptor)
	var out []*victim
	candidates := make([]*victim, len(all))
	for i, dv := range all {
		candidates[i] = &victim{Victim: dv, nodes: dv.AffectedNodes()}
	}
	for _, v := range pl.wholeGangs(candidates) {
		if v.Priority() >= priority {
			continue
		}
		eligible := true
		for _, ni := range v.nodes {
			if !pl.IsEligiblePod(ni, v, preemptor) {
				eligible = false
				break
			}
		}
		if eligible {
			out = append(out, v)
		}
	}
	return out
}

func pick[T any](all []T, idx []int) []T {
	out := make([]T, 0, len(idx))
	for _, i := range idx {
		out = append(out, all[i])
	}
	return out
}

func podsOf(v preemption.Victim) []*v1.Pod {
	out := make([]*v1.Pod, 0, len(v.Pods()))
	for _, pi := range v.Pods() {
		out = append(out, pi.GetPod())
	}
	slices.SortFunc(out, func(a, b *v1.Pod) int {
		if a.Namespace != b.Namespace {
			if a.Namespace < b.Namespace {
				return -1
			}
			return 1
		}
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}
