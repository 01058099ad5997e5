package room

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// consolidation frees whole groups ahead of demand: once per period, the
// first scheduling cycle after it is due moves the fewest pods (at most
// the budget) whose move frees a group of the largest size the driver
// publishes, on a node that has none free, each to a node that has none
// free either (or elsewhere on the same node), so that no free group is
// broken for it. It runs in a scheduling cycle (the plugin's PreFilter),
// on the snapshot the cycle took: the snapshot and the Filter plugins
// belong to the scheduling goroutine, and only the leader schedules. A
// scheduler with nothing to schedule consolidates nothing; where a pod
// then waits for a group, defragmentation for it does the same work.
type consolidation struct {
	period time.Duration
	// clock tells the time a cycle starts at.
	clock clock.PassiveClock

	mu sync.Mutex
	// next is when the next consolidation is due; zero: one period after
	// the first cycle.
	next time.Time
}

// due says whether a consolidation is due now, and if so sets the next.
func (c *consolidation) due() bool {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next.IsZero() {
		c.next = now.Add(c.period)
		return false
	}
	if now.Before(c.next) {
		return false
	}
	c.next = now.Add(c.period)
	return true
}

// consolidationPod is the pod a consolidation makes room for: it does
// not exist, and asks for one device of the class.
const consolidationPod = "kyb-scheduler-consolidation"

// consolidate runs one consolidation: evictions (or, in a dry run, a
// report of them) and how many.
func (pl *Preemption) consolidate(ctx context.Context) (int, error) {
	logger := klog.FromContext(ctx)
	class, size, err := pl.largestGroupClass()
	if err != nil || class == "" || size < 2 {
		return 0, err
	}
	pod, claim := virtualPod(class)
	runner, ok := pl.fh.(preFilterRunner)
	if !ok {
		return 0, fmt.Errorf("the framework handle %T runs no PreFilter pass", pl.fh)
	}
	state := framework.NewCycleState()
	state.Write(dynamicresources.PodClaimsKey, &dynamicresources.PodClaims{Claims: []*resourceapi.ResourceClaim{claim}})
	if _, status, _ := runner.RunPreFilterPlugins(ctx, state, pod); !status.IsSuccess() {
		if status.IsRejected() {
			return 0, nil
		}
		return 0, status.AsError()
	}
	pl.underway.prune(pl.pods)
	filterState := pl.withUnderway(state, pl.underway.list())
	infos, err := pl.fh.SnapshotSharedLister().NodeInfos().List()
	if err != nil {
		return 0, err
	}
	// Nodes with a free group of the size are neither freed again nor
	// given a moved pod (which might break it); nor are closed nodes.
	var candidates []fwk.NodeInfo
	targets := sets.New[string]()
	for _, ni := range infos {
		if ni.Node() == nil || closed(ni.Node()) {
			continue
		}
		st := pl.fh.RunFilterPluginsWithNominatedPods(ctx, filterState, pod, ni)
		switch {
		case st.IsSuccess():
		case st.Code() == fwk.Unschedulable:
			candidates = append(candidates, ni)
			targets.Insert(ni.Node().Name)
		case st.IsRejected():
			targets.Insert(ni.Node().Name)
		default:
			return 0, st.AsError()
		}
	}
	pdbs, err := pl.Evaluator.PdbLister.List(klabels.Everything())
	if err != nil {
		return 0, fmt.Errorf("list PodDisruptionBudgets: %w", err)
	}
	var best *plan
	for _, ni := range candidates {
		p, err := pl.planOn(ctx, state, pod, ni, pdbs, math.MaxInt32, func(r *room) { r.targets = targets })
		if err != nil {
			return 0, err
		}
		if p == nil || len(p.victims) > pl.defrag.EvictionsPerCycle {
			continue
		}
		if best == nil || p.cost.compare(best.cost) < 0 || (p.cost.compare(best.cost) == 0 && p.node < best.node) {
			best = p
		}
	}
	if best == nil {
		logger.V(4).Info("Consolidation found nothing to move within its budget", "class", class, "budget", pl.defrag.EvictionsPerCycle)
		return 0, nil
	}
	if pl.defrag.Mode == DryRun {
		pl.report(ctx, nil, best, true)
		return 0, nil
	}
	pl.report(ctx, nil, best, false)
	evicted, err := pl.evictAll(ctx, nil, best)
	pl.underway.add(best.moves, evicted)
	return len(evicted), err
}

// closed says whether a node takes no new pods: cordoned, or tainted by
// the node lifecycle controller. Consolidation's pod tolerates every
// taint, so Filter would free a group there that no pod can use, and
// evict pods an operator may have cordoned the node to let finish.
func closed(node *v1.Node) bool {
	if node.Spec.Unschedulable {
		return true
	}
	for _, t := range node.Spec.Taints {
		switch t.Key {
		case v1.TaintNodeUnschedulable, v1.TaintNodeNotReady, v1.TaintNodeUnreachable:
			return true
		}
	}
	return false
}

// largestGroupClass is the DeviceClass of the driver's largest group
// that takes its GPUs whole, and its size in GPUs: the profile of the
// device naming the most GPUs, and the class selecting that profile (as
// the driver's classes do, driver.ProfileSelector). Empty where no
// class selects it.
func (pl *Preemption) largestGroupClass() (string, int, error) {
	slices, err := pl.dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return "", 0, fmt.Errorf("list ResourceSlices: %w", err)
	}
	profile, size := "", 0
	for _, s := range slices {
		if s.Spec.Driver != driver.Name {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			gpus := d.Attributes[resourceapi.QualifiedName(v1alpha1.AttrGPUIndices)].StringValue
			name := d.Attributes[resourceapi.QualifiedName(v1alpha1.AttrProfile)].StringValue
			if gpus == nil || name == nil {
				continue
			}
			if n := len(strings.Split(*gpus, ",")); n > size {
				profile, size = *name, n
			}
		}
	}
	if profile == "" {
		return "", 0, nil
	}
	classes, err := pl.dra.DeviceClasses().List()
	if err != nil {
		return "", 0, fmt.Errorf("list DeviceClasses: %w", err)
	}
	want := driver.ProfileSelector(profile)
	for _, dc := range classes {
		for _, sel := range dc.Spec.Selectors {
			if sel.CEL != nil && sel.CEL.Expression == want {
				return dc.Name, size, nil
			}
		}
	}
	return "", size, nil
}

// virtualPod is a pod, and its claim, for one device of class: what a
// consolidation makes room for.
func virtualPod(class string) (*v1.Pod, *resourceapi.ResourceClaim) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: consolidationPod, Namespace: metav1.NamespaceSystem, UID: types.UID(consolidationPod + "-claim")}}
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
	}}}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: consolidationPod, Namespace: metav1.NamespaceSystem, UID: types.UID(consolidationPod)},
		Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(consolidationPod)}},
			Containers:     []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
			// Every taint: GPU nodes are often tainted for GPU pods, and
			// the group is freed for whichever pod may go there (the
			// moved pods are judged by their own tolerations).
			Tolerations: []v1.Toleration{{Operator: v1.TolerationOpExists}},
			// The lowest: Filter keeps the devices of every nominated pod
			// from it.
			Priority: ptr.To[int32](math.MinInt32),
		},
	}
	return pod, claim
}
