package room

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
)

// move is where a moved pod's replacement fits, with what the allocator
// gave its claims there.
type move struct {
	// original is the moved pod's UID; pod its replacement.
	original   types.UID
	pod        *v1.Pod
	node       string
	allocation []resourceapi.AllocationResult
}

// preFilterRunner is the framework's PreFilter pass, which a plugin's
// Handle has (frameworkruntime's framework) but does not declare.
type preFilterRunner interface {
	RunPreFilterPlugins(ctx context.Context, state fwk.CycleState, pod *v1.Pod) (*fwk.PreFilterResult, *fwk.Status, sets.Set[string])
}

// room is what a defragmentation makes: the pods it moves off node, and
// the devices they leave to the waiting pod there (a pod that does not
// exist, for a consolidation).
type room struct {
	node    string
	waiting *v1.Pod
	// kept are the devices the waiting pod gets on node.
	kept  []resourceapi.AllocationResult
	moved []*v1.Pod
	// targets, where set, are the only nodes besides node that the moved
	// pods may go to.
	targets sets.Set[string]
}

// moves finds a node for the replacement of each moved pod, as the Filter
// plugins judge it (the allocator among them, allocating its claims
// afresh): with the moved pods gone from node, the waiting pod holding
// its devices there, and the replacements placed before it where they
// went, those of earlier defragmentations' moves under way first. The pods holding the most devices go first. Nodes are tried in
// order: node itself (a seat elsewhere on it), then the nodes with the
// most pods, as pack fills them. False where one fits nowhere.
func (pl *Preemption) moves(ctx context.Context, r room) ([]move, bool, error) {
	runner, ok := pl.fh.(preFilterRunner)
	if !ok {
		return nil, false, fmt.Errorf("the framework handle %T runs no PreFilter pass", pl.fh)
	}
	logger := klog.FromContext(ctx)
	infos, err := pl.fh.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return nil, false, err
	}
	nodes := make([]fwk.NodeInfo, 0, len(infos))
	for _, ni := range infos {
		if ni.Node() == nil {
			continue
		}
		name := ni.Node().Name
		if name != r.node && r.targets != nil && !r.targets.Has(name) {
			continue
		}
		nodes = append(nodes, ni)
	}
	slices.SortStableFunc(nodes, func(a, b fwk.NodeInfo) int {
		if a.Node().Name == r.node || b.Node().Name == r.node {
			return cmpBool(b.Node().Name == r.node, a.Node().Name == r.node)
		}
		return cmp.Or(cmp.Compare(len(b.GetPods()), len(a.GetPods())), cmp.Compare(a.Node().Name, b.Node().Name))
	})
	removed := map[types.UID]*v1.Pod{}
	for _, p := range r.moved {
		removed[p.UID] = p
	}
	order := slices.Clone(r.moved)
	held := map[types.UID]int{}
	for _, p := range order {
		for _, c := range podClaims(pl.dra, p) {
			held[p.UID] += len(c.Status.Allocation.Devices.Results)
		}
	}
	slices.SortStableFunc(order, func(a, b *v1.Pod) int {
		return cmp.Or(cmp.Compare(held[b.UID], held[a.UID]), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})

	// The replacements of earlier moves are placed before these.
	earlier := pl.underway.list()
	var out []move
	for _, p := range order {
		m, ok, err := pl.moveOne(ctx, runner, r, p, nodes, removed, slices.Concat(earlier, out))
		if err != nil || !ok {
			if err == nil {
				logger.V(4).Info("A pod defragmentation would move fits no node", "pod", klog.KObj(p), "node", r.node, "for", klog.KObj(r.waiting))
			}
			return nil, false, err
		}
		out = append(out, m)
	}
	return out, true, nil
}

// moveOne finds the first of nodes where p's replacement fits.
func (pl *Preemption) moveOne(ctx context.Context, runner preFilterRunner, r room, p *v1.Pod, nodes []fwk.NodeInfo, removed map[types.UID]*v1.Pod, before []move) (move, bool, error) {
	claims, ok := freshClaims(pl.dra, p)
	if !ok {
		return move{}, false, nil
	}
	newPod := replacement(p)
	state := framework.NewCycleState()
	state.Write(dynamicresources.PodClaimsKey, &dynamicresources.PodClaims{Claims: claims})
	result, status, _ := runner.RunPreFilterPlugins(ctx, state, newPod)
	if !status.IsSuccess() {
		if status.IsRejected() {
			return move{}, false, nil
		}
		return move{}, false, status.AsError()
	}
	record := newAllocationRecord()
	if c := newChanges(state, pl.dra); c != nil {
		c = c.copy()
		c.record = record
		for uid, pod := range removed {
			c.removed[uid] = pod
		}
		if r.kept != nil {
			c.added[r.waiting.UID] = r.kept
		}
		for _, m := range before {
			c.added[m.pod.UID] = m.allocation
		}
		c.write(state)
	}
	for _, ni := range nodes {
		name := ni.Node().Name
		if result != nil && !result.AllNodes() && !result.NodeNames.Has(name) {
			continue
		}
		ni = ni.Snapshot()
		if name == r.node {
			for _, v := range r.moved {
				if err := ni.RemovePod(klog.FromContext(ctx), v); err != nil {
					return move{}, false, err
				}
			}
			if r.waiting != nil {
				if err := addPod(ni, r.waiting, name); err != nil {
					return move{}, false, err
				}
			}
		}
		for _, m := range before {
			if m.node == name {
				if err := addPod(ni, m.pod, name); err != nil {
					return move{}, false, err
				}
			}
		}
		st := pl.fh.RunFilterPluginsWithNominatedPods(ctx, state, newPod, ni)
		if st.IsSuccess() {
			allocation, _ := record.get(name)
			return move{original: p.UID, pod: newPod, node: name, allocation: allocation}, true, nil
		}
		if !st.IsRejected() {
			return move{}, false, st.AsError()
		}
	}
	return move{}, false, nil
}

// addPod adds a pod to a node's copy as if bound there.
func addPod(ni fwk.NodeInfo, pod *v1.Pod, node string) error {
	p := pod.DeepCopy()
	p.Spec.NodeName = node
	pi, err := framework.NewPodInfo(p)
	if err != nil {
		return err
	}
	ni.AddPodInfo(pi)
	return nil
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
