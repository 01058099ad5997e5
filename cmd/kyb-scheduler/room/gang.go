package room

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
)

// victim is a candidate for eviction, with the nodes its pods run on.
type victim struct {
	preemption.Victim
	nodes map[string]fwk.NodeInfo
}

// wholeGangs are the candidates with the pods of a gang as one: a pod
// of a PodGroup with a gang policy stands for every scheduled pod of the
// group, on whatever node, and is evicted with them or not at all.
// DefaultPreemption does so only for groups with the disruption mode
// All; a gang below its minimum count would hold its devices idle.
func (pl *Preemption) wholeGangs(all []*preemption.DomainVictim) []*victim {
	snapshot := pl.fh.SnapshotSharedLister()
	seen := sets.New[fwk.EntityKey]()
	var out []*victim
	for _, dv := range all {
		v := &victim{Victim: dv, nodes: dv.AffectedNodes()}
		pods := dv.Pods()
		if len(pods) != 1 || pods[0].GetPod().Spec.SchedulingGroup == nil || pods[0].GetPod().Spec.SchedulingGroup.PodGroupName == nil {
			out = append(out, v)
			continue
		}
		p := pods[0].GetPod()
		name := *p.Spec.SchedulingGroup.PodGroupName
		pg, err := snapshot.PodGroups().Get(p.Namespace, name)
		if err != nil || pg.Spec.SchedulingPolicy.Gang == nil {
			out = append(out, v)
			continue
		}
		key := fwk.PodGroupKey(p.Namespace, name)
		if seen.Has(key) {
			continue
		}
		seen.Insert(key)
		state, err := snapshot.PodGroupStates().Get(p.Namespace, name)
		if err != nil {
			out = append(out, v)
			continue
		}
		var infos []fwk.PodInfo
		nodes := map[string]fwk.NodeInfo{}
		for _, member := range state.ScheduledPods() {
			pi, err := framework.NewPodInfo(member)
			if err != nil {
				continue
			}
			infos = append(infos, pi)
			if ni, err := snapshot.NodeInfos().Get(member.Spec.NodeName); err == nil {
				nodes[member.Spec.NodeName] = ni
			}
		}
		gang, err := preemption.NewVictim(infos, dv.Priority(), fwk.PodGroupKeyType)
		if err != nil {
			out = append(out, v)
			continue
		}
		out = append(out, &victim{Victim: gang, nodes: nodes})
	}
	return out
}

// PodGroupPostFilter is DefaultPreemption's preemption for a pod group:
// the group preempts as one, so that a gang member preempts only for its
// whole gang. kube-scheduler removes every lower-priority pod from its
// snapshot and schedules the group's pods again (schedule), then puts
// back what it can, the most important first. Pods removed from the
// snapshot keep their devices for the DynamicResources plugin, whose
// state comes from the claims: so while schedule runs, the claims that
// only removed pods use are released for the group's pods (PreFilter), and
// the devices found for each pod are kept for it where it is nominated.
func (pl *Preemption) PodGroupPostFilter(ctx context.Context, state fwk.PodGroupCycleState, pgInfo fwk.PodGroupInfo, schedule fwk.PodGroupSchedulingFunc) (*fwk.PodGroupPostFilterResult, *fwk.Status) {
	nodes := pl.fh.MutableSnapshotSharedLister().NodeInfos()
	before := podsOnNodes(nodes)
	defer pl.gang.end()
	release := func(ctx context.Context) (*fwk.PodGroupAssignments, *fwk.Status) {
		removed := map[types.UID]*v1.Pod{}
		now := podsOnNodes(nodes)
		for uid, p := range before {
			if _, ok := now[uid]; !ok {
				removed[uid] = p
			}
		}
		pl.gang.begin(removed)
		return schedule(ctx)
	}
	res, status := pl.DefaultPreemption.PodGroupPostFilter(ctx, state, pgInfo, release)
	if status.IsSuccess() && res != nil {
		for _, pod := range pgInfo.GetUnscheduledPods() {
			info := res.NominatingInfos[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}]
			if info == nil || info.NominatedNodeName == "" {
				continue
			}
			if allocation, ok := pl.gang.found(pod.UID, info.NominatedNodeName); ok {
				pl.kept.set(pod, info.NominatedNodeName, allocation)
			}
		}
	}
	return res, status
}

func podsOnNodes(nodes fwk.NodeInfoLister) map[types.UID]*v1.Pod {
	out := map[types.UID]*v1.Pod{}
	list, err := nodes.List()
	if err != nil {
		return out
	}
	for _, ni := range list {
		for _, pi := range ni.GetPods() {
			out[pi.GetPod().UID] = pi.GetPod()
		}
	}
	return out
}

// gangRelease is the release of a pod group preemption's dry run: the
// pods it removed from the snapshot, and what Filter allocated for each
// of the group's pods with them removed.
type gangRelease struct {
	mu      sync.Mutex
	active  bool
	removed map[types.UID]*v1.Pod
	// allocated are the group's pods' allocations, the last Filter
	// allocated per node: kube-scheduler puts victims back one by one
	// and filters again, and the last allocation that fits is one with
	// the victims that stay.
	allocated map[types.UID]map[string][]resourceapi.AllocationResult
}

func (g *gangRelease) begin(removed map[types.UID]*v1.Pod) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active, g.removed, g.allocated = true, removed, map[types.UID]map[string][]resourceapi.AllocationResult{}
}

func (g *gangRelease) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active, g.removed, g.allocated = false, nil, nil
}

// apply writes the release into a group pod's cycle state, where a dry
// run is on.
func (g *gangRelease) apply(cs fwk.CycleState, pod *v1.Pod, dra fwk.SharedDRAManager) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.active || len(g.removed) == 0 {
		return
	}
	c := newChanges(cs, dra)
	if c == nil {
		return
	}
	c = c.copy()
	for uid, p := range g.removed {
		c.removed[uid] = p
	}
	c.allocated = func(node string, results []resourceapi.AllocationResult) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.allocated == nil {
			return
		}
		if g.allocated[pod.UID] == nil {
			g.allocated[pod.UID] = map[string][]resourceapi.AllocationResult{}
		}
		g.allocated[pod.UID][node] = results
	}
	c.write(cs)
}

func (g *gangRelease) found(pod types.UID, node string) ([]resourceapi.AllocationResult, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	a, ok := g.allocated[pod][node]
	return a, ok
}
