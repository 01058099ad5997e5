package room

import (
	"context"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
)

// PodGroupPostFilter preempts for a pod group as one: a gang member
// preempts only for its whole gang, in the pod group cycle. The judge is
// kube-scheduler's own scheduling of the group (schedule: every pod,
// Filter and Reserve, all or none): with a set of candidates removed from
// the snapshot and their claims released (gang.go), does the whole group
// fit? It does with every lower-priority pod removed, or nothing helps;
// then the victims are those whose devices the group's allocations take
// (as Search finds them for one pod), where the group fits with only
// those removed, and any of them it fits without is spared, the most
// important first.
//
// DefaultPreemption's pod group preemption removes every lower-priority
// pod, schedules the group, and puts back victims while each pod still
// fits its node; for claims the put-back cannot fail, since a pod's
// allocation is kept from its Reserve, so it evicts nothing. Composite
// pod groups are left to it.
func (pl *Preemption) PodGroupPostFilter(ctx context.Context, state fwk.PodGroupCycleState, pgInfo fwk.PodGroupInfo, schedule fwk.PodGroupSchedulingFunc) (*fwk.PodGroupPostFilterResult, *fwk.Status) {
	pg := pgInfo.GetPodGroup()
	if pg == nil {
		return pl.DefaultPreemption.PodGroupPostFilter(ctx, state, pgInfo, schedule)
	}
	logger := klog.FromContext(ctx)
	pods := pgInfo.GetUnscheduledPods()
	if len(pods) == 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pod group preemption: no pod to schedule")
	}
	priority := schedutil.PodGroupPriority(pg)
	if ptr := pg.Spec.PreemptionPolicy; ptr != nil && *ptr == schedulingv1beta1.PreemptNever {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pod group preemption: not eligible due to preemptionPolicy=Never.")
	}
	for _, p := range pods {
		if p.Spec.PreemptionPolicy != nil && *p.Spec.PreemptionPolicy == v1.PreemptNever {
			return nil, fwk.NewStatus(fwk.Unschedulable, "pod group preemption: not eligible due to preemptionPolicy=Never.")
		}
	}
	lister := pl.fh.MutableSnapshotSharedLister()
	if nominated := ongoing(lister, pods, priority); nominated != nil {
		return &fwk.PodGroupPostFilterResult{NominatingInfos: nominated}, fwk.NewStatus(fwk.Success, "ongoing preemption on nominated nodes")
	}
	if err := lister.StartMutations(); err != nil {
		return nil, fwk.AsStatus(fmt.Errorf("pod group preemption: start mutations: %w", err))
	}
	defer func() {
		if err := lister.EndMutations(); err != nil {
			logger.Error(err, "Pod group preemption could not restore the snapshot", "podGroup", klog.KObj(pg))
		}
	}()

	victims, err := pl.groupVictims(lister, pods[0], priority)
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	if len(victims) == 0 {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "pod group preemption: no preemption victims found")
	}
	run := &groupRun{pl: pl, lister: lister, victims: victims, removed: sets.New[int](), logger: logger, schedule: schedule}
	all := make([]int, len(victims))
	for i := range all {
		all[i] = i
	}
	best, ok, err := run.fit(ctx, all)
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	if !ok {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pod group preemption: the group does not fit with every lower-priority pod evicted")
	}
	chosen := all
	if candidate := run.conflicts(best); len(candidate) < len(all) {
		if r, ok, err := run.fit(ctx, candidate); err != nil {
			return nil, fwk.AsStatus(err)
		} else if ok {
			chosen, best = candidate, r
		}
	}
	// Spare what the group fits without, the most important first.
	slices.SortStableFunc(chosen, func(a, b int) int {
		return cmpPriority(victims[b].Priority(), victims[a].Priority())
	})
	for i := 0; i < len(chosen); {
		rest := slices.Delete(slices.Clone(chosen), i, i+1)
		r, ok, err := run.fit(ctx, rest)
		if err != nil {
			return nil, fwk.AsStatus(err)
		}
		if ok {
			chosen, best = rest, r
			continue
		}
		i++
	}

	var victimPods []*v1.Pod
	for _, i := range chosen {
		victimPods = append(victimPods, podsOf(victims[i])...)
	}
	preemptor := &groupPreemptor{pg: pg, pods: pods}
	c := &groupCandidate{victims: &extenderv1.Victims{Pods: victimPods}}
	for _, p := range victimPods {
		if _, err := pl.evict(ctx, c, preemptor, p, Name); err != nil {
			return nil, fwk.AsStatus(fmt.Errorf("pod group preemption: %w", err))
		}
	}
	nominated := map[types.NamespacedName]*fwk.NominatingInfo{}
	for _, a := range best.assignments {
		nominated[types.NamespacedName{Namespace: a.pod.Namespace, Name: a.pod.Name}] = &fwk.NominatingInfo{NominatingMode: fwk.ModeOverride, NominatedNodeName: a.node}
		if allocation, ok := best.allocated[a.pod.UID][a.node]; ok {
			pl.kept.set(a.pod, a.node, allocation, nil, held{})
		}
	}
	logger.V(2).Info("Pod group preemption", "podGroup", klog.KObj(pg), "victims", klog.KObjSlice(victimPods), "groupRuns", run.runs)
	return &fwk.PodGroupPostFilterResult{NominatingInfos: nominated}, fwk.NewStatus(fwk.Success, fmt.Sprintf("found a placement for podgroup, preempting %d victims", len(victimPods)))
}

func cmpPriority(a, b int32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ongoing are the group's nominations where a preemption for it is still
// under way: a lower-priority pod terminates on a node one of its pods
// is nominated to.
func ongoing(lister fwk.MutableSnapshotSharedLister, pods []*v1.Pod, priority int32) map[types.NamespacedName]*fwk.NominatingInfo {
	terminating := false
	for _, p := range pods {
		if p.Status.NominatedNodeName == "" {
			continue
		}
		ni, err := lister.NodeInfos().Get(p.Status.NominatedNodeName)
		if err != nil {
			continue
		}
		for _, pi := range ni.GetPods() {
			if corev1helpers.PodPriority(pi.GetPod()) < priority && preemption.PodTerminatingByPreemption(pi.GetPod()) {
				terminating = true
			}
		}
	}
	if !terminating {
		return nil
	}
	out := map[types.NamespacedName]*fwk.NominatingInfo{}
	for _, p := range pods {
		out[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = &fwk.NominatingInfo{NominatingMode: fwk.ModeOverride, NominatedNodeName: p.Status.NominatedNodeName}
	}
	return out
}

// groupVictims are the candidates for a group of the given priority:
// every pod of a lower priority on any node, eligible as DefaultPreemption
// asks, a gang's pods as one.
func (pl *Preemption) groupVictims(lister fwk.MutableSnapshotSharedLister, preemptor *v1.Pod, priority int32) ([]*victim, error) {
	nodes, err := lister.NodeInfos().List()
	if err != nil {
		return nil, err
	}
	var all []*victim
	for _, ni := range nodes {
		for _, pi := range ni.GetPods() {
			v := preemption.NewPodVictim(pi, lister.PodGroups(), nil)
			all = append(all, &victim{Victim: v, nodes: map[string]fwk.NodeInfo{ni.Node().Name: ni}})
		}
	}
	var out []*victim
	for _, v := range pl.wholeGangs(all) {
		if v.Priority() >= priority {
			continue
		}
		eligible := true
		for _, ni := range v.nodes {
			eligible = eligible && pl.IsEligiblePod(ni, v, preemptor)
		}
		if eligible {
			out = append(out, v)
		}
	}
	return out, nil
}

// groupRun schedules the group with sets of victims removed.
type groupRun struct {
	pl       *Preemption
	lister   fwk.MutableSnapshotSharedLister
	victims  []*victim
	removed  sets.Set[int]
	logger   klog.Logger
	schedule fwk.PodGroupSchedulingFunc
	runs     int
}

type groupResult struct {
	assignments []assignment
	allocated   map[types.UID]map[string][]resourceapi.AllocationResult
}

type assignment struct {
	pod  *v1.Pod
	node string
}

// fit schedules the group with exactly the given victims removed from the
// snapshot and their claims released.
func (r *groupRun) fit(ctx context.Context, released []int) (*groupResult, bool, error) {
	r.runs++
	want := sets.New(released...)
	for i := range r.removed.Difference(want) {
		for _, pi := range r.victims[i].Pods() {
			if err := r.lister.AddPod(pi, pi.GetPod().Spec.NodeName); err != nil {
				return nil, false, err
			}
		}
	}
	for i := range want.Difference(r.removed) {
		for _, pi := range r.victims[i].Pods() {
			if err := r.lister.RemovePod(r.logger, pi.GetPod(), pi.GetPod().Spec.NodeName); err != nil {
				return nil, false, err
			}
		}
	}
	r.removed = want
	removed := map[types.UID]*v1.Pod{}
	for i := range want {
		for _, p := range podsOf(r.victims[i]) {
			removed[p.UID] = p
		}
	}
	r.pl.gang.begin(removed)
	defer r.pl.gang.end()
	assignments, status := r.schedule(ctx)
	if !status.IsSuccess() {
		if !status.IsRejected() {
			return nil, false, status.AsError()
		}
		return nil, false, nil
	}
	res := &groupResult{allocated: r.pl.gang.allocations()}
	for _, a := range assignments.ProposedAssignments {
		if a.GetNodeName() == "" {
			return nil, false, nil
		}
		res.assignments = append(res.assignments, assignment{pod: a.GetPod(), node: a.GetNodeName()})
	}
	return res, true, nil
}

// conflicts are the victims whose devices the group's allocations take,
// node by node, as Search finds them for one pod.
func (r *groupRun) conflicts(res *groupResult) []int {
	state, err := r.pl.dra.ResourceClaims().GatherAllocatedState()
	if err != nil {
		return nil
	}
	slices, err := r.pl.dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil
	}
	units := make([]Unit, len(r.victims))
	for i, v := range r.victims {
		units[i] = Unit{Pods: podsOf(v), Priority: v.Priority()}
	}
	byNode := map[string][][]resourceapi.AllocationResult{}
	for _, a := range res.assignments {
		if alloc, ok := res.allocated[a.pod.UID][a.node]; ok {
			byNode[a.node] = append(byNode[a.node], alloc)
		}
	}
	out := sets.New[int]()
	for node, allocs := range byNode {
		use := newUsage(r.pl.dra, state, nodeInventory(slices, node), units)
		var all []resourceapi.AllocationResult
		for _, a := range allocs {
			all = append(all, a...)
		}
		hs := use.conflict(all, func(int) bool { return true }, func([]int) cost { return cost{} })
		out.Insert(use.unitsOf(hs)...)
	}
	return sets.List(out)
}

// groupPreemptor is the pod group, as the evictions name it.
type groupPreemptor struct {
	pg   *schedulingv1beta1.PodGroup
	pods []*v1.Pod
}

func (p *groupPreemptor) GetName() string      { return p.pg.Name }
func (p *groupPreemptor) GetNamespace() string { return p.pg.Namespace }
func (p *groupPreemptor) UID() types.UID       { return p.pg.UID }
func (p *groupPreemptor) Obj() runtime.Object  { return p.pg }
func (p *groupPreemptor) Priority() int32      { return schedutil.PodGroupPriority(p.pg) }
func (p *groupPreemptor) Type() string         { return string(fwk.PodGroupKeyType) }
func (p *groupPreemptor) SchedulerName() string {
	if len(p.pods) > 0 {
		return p.pods[0].Spec.SchedulerName
	}
	return ""
}
func (p *groupPreemptor) Pods() map[string]*v1.Pod {
	out := map[string]*v1.Pod{}
	for _, pod := range p.pods {
		out[pod.Name] = pod
	}
	return out
}

// groupCandidate is the group preemption's victims, cluster-wide.
type groupCandidate struct{ victims *extenderv1.Victims }

func (c *groupCandidate) Victims() *extenderv1.Victims { return c.victims }
func (c *groupCandidate) Name() string                 { return "cluster" }
func (c *groupCandidate) NumPodGroupDisruptions() int  { return 0 }

var _ preemption.ExecutorPreemptor = &groupPreemptor{}
var _ preemption.Candidate = &groupCandidate{}
