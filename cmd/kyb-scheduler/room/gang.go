package room

import (
	"maps"
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
func (pl *Preemption) wholeGangs(all []*victim) []*victim {
	snapshot := pl.fh.SnapshotSharedLister()
	seen := sets.New[fwk.EntityKey]()
	var out []*victim
	for _, v := range all {
		pods := v.Pods()
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
		gang, err := preemption.NewVictim(infos, v.Priority(), fwk.PodGroupKeyType)
		if err != nil {
			out = append(out, v)
			continue
		}
		out = append(out, &victim{Victim: gang, nodes: nodes})
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
	// reserved are the nodes the group's pods were reserved on.
	reserved map[types.UID]string
}

func (g *gangRelease) begin(removed map[types.UID]*v1.Pod) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active, g.removed, g.allocated, g.reserved = true, removed, map[types.UID]map[string][]resourceapi.AllocationResult{}, map[types.UID]string{}
}

func (g *gangRelease) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active, g.removed, g.allocated, g.reserved = false, nil, nil, nil
}

// apply writes the release into a group pod's cycle state, where a dry
// run is on.
func (g *gangRelease) apply(cs fwk.CycleState, pod *v1.Pod, dra fwk.SharedDRAManager) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.active {
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
	// The group's pods reserved before this one hold their devices in
	// flight; a device of a released claim is theirs now.
	for uid, node := range g.reserved {
		if uid != pod.UID && g.allocated[uid][node] != nil {
			c.added[uid] = g.allocated[uid][node]
		}
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

// allocations are what Filter allocated for the group's pods, by pod and
// node.
func (g *gangRelease) allocations() map[types.UID]map[string][]resourceapi.AllocationResult {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.allocated)
}

// reserve records the node a group's pod was reserved on, in a dry run.
func (g *gangRelease) reserve(pod types.UID, node string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active {
		g.reserved[pod] = node
	}
}

func (g *gangRelease) unreserve(pod types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active {
		delete(g.reserved, pod)
	}
}
