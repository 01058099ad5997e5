package placement

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	resourceslicetracker "k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/dynamic-resource-allocation/structured/schedulerapi"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// The fixture is a small cluster as the scheduler sees it: simulated
// nodes' slices as the plugin publishes them (pkg/draresources), the
// DeviceClasses, and claims in a fake API server, read through the
// scheduler's real DRA manager (assume cache, slice tracker, claim
// tracker with its in-flight allocations). The real allocator
// (pkg/schedulertest) is the Filter and chooses the devices; the plugin
// scores the nodes that fit, as kube-scheduler calls it.

const (
	class1x = "gpu-1x-seat.kyb.ai"
	class2x = "gpu-2x-seat.kyb.ai"
	class4x = "gpu-4x-seat.kyb.ai"
)

// threeProfiles is one seat per group of 1, 2 and 4 GPUs.
const threeProfiles = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-4x-seat}
`

type nodeSpec struct{ name, preset, config string }

type fixture struct {
	t      testing.TB
	ctx    context.Context
	client *fake.Clientset
	dra    *dynamicresources.DefaultDRAManager
	sim    *schedulertest.Cluster
	plugin *Plugin
	nodes  []string
	n      int
}

func newFixture(t testing.TB, args Args, nodes ...nodeSpec) *fixture {
	t.Helper()
	ctx := klog.NewContext(context.Background(), logr.Discard())
	if tt, ok := t.(*testing.T); ok {
		// Tests log; benchmarks measure the plugin, not the logging.
		_, ctx = ktesting.NewTestContext(tt)
	}
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, client: fake.NewClientset(), sim: schedulertest.New(schedulertest.SchedulerFeatures())}
	classes := map[string]*resourceapi.DeviceClass{}
	type planned struct {
		plan *planner.Plan
		inv  *inventory.Inventory
	}
	plans := map[nodeSpec]planned{}
	for _, n := range nodes {
		// Nodes alike have the same plan; only the pool's name differs.
		key := nodeSpec{preset: n.preset, config: n.config}
		p, ok := plans[key]
		if !ok {
			p.plan, p.inv = planNode(t, ctx, n)
			plans[key] = p
		}
		plan, inv := p.plan, p.inv
		f.sim.AddNode(n.name, draresources.Resources(plan, inv, n.name, draresources.LayoutShared), driver.Name)
		for _, dc := range draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{ExtendedResources: true}) {
			dc.UID = types.UID("uid-" + dc.Name)
			dc.ResourceVersion = "1"
			classes[dc.Name] = dc
		}
		f.nodes = append(f.nodes, n.name)
	}
	for _, s := range f.sim.Slices() {
		s := s.DeepCopy()
		s.UID, s.ResourceVersion = types.UID("uid-"+s.Name), "1"
		f.create(s)
	}
	for _, name := range slices.Sorted(maps.Keys(classes)) {
		f.sim.AddClasses(classes[name])
		f.create(classes[name])
	}

	factory := informers.NewSharedInformerFactory(f.client, 0)
	claims := assumecache.NewAssumeCache(klog.FromContext(ctx), factory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
	tracker, err := resourceslicetracker.StartTracker(ctx, resourceslicetracker.Options{
		SliceInformer: factory.Resource().V1().ResourceSlices(), KubeClient: f.client, EnableConsumableCapacity: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.dra = dynamicresources.NewDRAManager(ctx, claims, tracker, factory)
	// As the scheduler's event handlers do: classes feed the resolver of
	// extended resources.
	if _, err := factory.Resource().V1().DeviceClasses().Informer().AddEventHandler(f.dra.DeviceClassResolver().(*extendedresourcecache.ExtendedResourceCache)); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	f.waitFor("the slices", func() bool {
		s, err := f.dra.ResourceSlices().ListWithDeviceTaintRules()
		return err == nil && len(s) == len(f.sim.Slices())
	})
	f.waitFor("the classes", func() bool {
		for _, c := range classes {
			if r := c.Spec.ExtendedResourceName; r != nil && f.dra.DeviceClassResolver().GetDeviceClass(v1.ResourceName(*r)) == nil {
				return false
			}
		}
		return true
	})
	f.plugin = NewWithManager(args, f.dra)
	return f
}

func planNode(t testing.TB, ctx context.Context, n nodeSpec) (*planner.Plan, *inventory.Inventory) {
	t.Helper()
	sim, err := simnode.Load(n.preset, n.name)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Discover(ctx, sim.NVML(), sim.PCIe())
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(n.config), "test config")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return plan, inv
}

func (f *fixture) create(obj any) {
	f.t.Helper()
	var err error
	switch o := obj.(type) {
	case *resourceapi.ResourceSlice:
		_, err = f.client.ResourceV1().ResourceSlices().Create(f.ctx, o, metav1.CreateOptions{})
	case *resourceapi.DeviceClass:
		_, err = f.client.ResourceV1().DeviceClasses().Create(f.ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceClaim:
		_, err = f.client.ResourceV1().ResourceClaims(o.Namespace).Create(f.ctx, o, metav1.CreateOptions{})
	default:
		f.t.Fatalf("create %T", obj)
	}
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		f.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// seatPod is a pod with one claim for count devices of class; its claim
// is created in the API server (and so reaches the claim tracker).
func (f *fixture) seatPod(class string, count int64, mutate ...func(*resourceapi.DeviceRequest)) (*v1.Pod, *resourceapi.ResourceClaim) {
	f.t.Helper()
	pod, claim := f.seatPodObjects(class, count, mutate...)
	f.create(claim)
	f.waitForClaim(claim)
	return pod, claim
}

// waitForClaim waits until the scheduler's claim cache has claim.
func (f *fixture) waitForClaim(claim *resourceapi.ResourceClaim) {
	f.t.Helper()
	f.waitFor("claim "+claim.Name, func() bool { _, err := f.dra.ResourceClaims().Get(claim.Namespace, claim.Name); return err == nil })
}

// seatPodObjects is seatPod's pod and claim, the claim not yet created.
func (f *fixture) seatPodObjects(class string, count int64, mutate ...func(*resourceapi.DeviceRequest)) (*v1.Pod, *resourceapi.ResourceClaim) {
	f.n++
	name := fmt.Sprintf("pod-%d", f.n)
	claim := schedulertest.Claim(name+"-gpu", class, count, mutate...)
	claim.ResourceVersion = "1"
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
			Containers:     []v1.Container{{Name: "app", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
	return pod, claim
}

// extendedPod asks for quantity of an extended resource in its limits.
func (f *fixture) extendedPod(name v1.ResourceName, quantity int64) *v1.Pod {
	f.n++
	q := *resource.NewQuantity(quantity, resource.DecimalSI)
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", f.n), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-pod-%d", f.n))},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{name: q}, Requests: v1.ResourceList{name: q},
		}}}},
	}
	return pod
}

// feasible are the nodes where the real allocator fits claim (Filter).
func (f *fixture) feasible(claim *resourceapi.ResourceClaim) []string {
	f.t.Helper()
	a, err := f.sim.Allocator(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return f.feasibleWith(a, claim)
}

// feasibleWith is feasible with the cycle's allocator.
func (f *fixture) feasibleWith(a structured.Allocator, claim *resourceapi.ResourceClaim) []string {
	f.t.Helper()
	var out []string
	for _, n := range f.nodes {
		r, err := f.sim.Try(f.ctx, a, claim, n)
		if err != nil {
			f.t.Fatal(err)
		}
		if r != nil {
			out = append(out, n)
		}
	}
	return out
}

// scores runs PreScore, Score and NormalizeScore over nodes, as the
// framework does. When PreScore skips, every node scores 0 (the framework
// calls no Score) and the status says so; on an error the map is nil.
func (f *fixture) scores(pod *v1.Pod, nodes []string) (map[string]int64, *fwk.Status) {
	f.t.Helper()
	return f.scoresIn(framework.NewCycleState(), pod, nodes)
}

// scoresIn is scores in a cycle whose state earlier plugins wrote.
func (f *fixture) scoresIn(state fwk.CycleState, pod *v1.Pod, nodes []string) (map[string]int64, *fwk.Status) {
	f.t.Helper()
	infos := nodeInfos(nodes...)
	if st := f.plugin.PreScore(f.ctx, state, pod, infos); st.Code() == fwk.Skip {
		zero := map[string]int64{}
		for _, n := range nodes {
			zero[n] = 0
		}
		return zero, st
	} else if !st.IsSuccess() {
		return nil, st
	}
	list := make(fwk.NodeScoreList, len(nodes))
	for i, ni := range infos {
		s, st := f.plugin.Score(f.ctx, state, pod, ni)
		if !st.IsSuccess() {
			f.t.Fatalf("Score %s: %v", nodes[i], st)
		}
		list[i] = fwk.NodeScore{Name: nodes[i], Score: s}
	}
	if st := f.plugin.ScoreExtensions().NormalizeScore(f.ctx, state, pod, list); !st.IsSuccess() {
		f.t.Fatalf("NormalizeScore: %v", st)
	}
	out := map[string]int64{}
	for _, s := range list {
		if s.Score < fwk.MinScore || s.Score > fwk.MaxScore {
			f.t.Fatalf("%s scored %d, outside %d..%d", s.Name, s.Score, fwk.MinScore, fwk.MaxScore)
		}
		out[s.Name] = s.Score
	}
	return out, nil
}

// best is the node with the highest score. Among equals kube-scheduler
// picks at random; here the pick rotates with turn, so that a test cannot
// pass by the order of the nodes alone.
func best(nodes []string, scores map[string]int64, turn int) string {
	var top []string
	for _, n := range nodes {
		switch {
		case len(top) == 0 || scores[n] > scores[top[0]]:
			top = []string{n}
		case scores[n] == scores[top[0]]:
			top = append(top, n)
		}
	}
	return top[turn%len(top)]
}

// schedule places a seat pod as kube-scheduler would with this score:
// Filter with the real allocator, score, pick the best node, allocate
// there, and hand the allocation to the claim tracker: in flight (as
// Reserve does) or written to the API server and seen by the informer
// (after PreBind), as written says.
func (f *fixture) schedule(pod *v1.Pod, claim *resourceapi.ResourceClaim, written bool) string {
	f.t.Helper()
	state := framework.NewCycleState()
	a := f.cycleAllocator(state, pod)
	nodes := f.feasibleWith(a, claim)
	if len(nodes) == 0 {
		f.t.Fatalf("%s fits nowhere", pod.Name)
	}
	scores, st := f.scoresIn(state, pod, nodes)
	if scores == nil {
		f.t.Fatalf("PreScore %s: %v", pod.Name, st)
	}
	node := best(nodes, scores, f.n)
	f.allocateWith(a, claim, node, written)
	return node
}

// cycleAllocator runs the plugin's PreFilter and returns the allocator
// kyb-scheduler's DynamicResources PreFilter builds after it: over the
// slices in the device order the plugin left, if it left one.
func (f *fixture) cycleAllocator(state fwk.CycleState, pod *v1.Pod) structured.Allocator {
	f.t.Helper()
	if _, st := f.plugin.PreFilter(f.ctx, state, pod, nil); !st.IsSuccess() && !st.IsSkip() {
		f.t.Fatalf("PreFilter %s: %v", pod.Name, st)
	}
	a, err := f.sim.AllocatorOrdered(f.ctx, func(s *structured.AllocatedState, all []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
		d, err := state.Read(dynamicresources.DeviceOrderKey)
		if err != nil {
			return all
		}
		return d.(dynamicresources.DeviceOrder).OrderDevices(f.ctx, s, all)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return a
}

func (f *fixture) allocate(claim *resourceapi.ResourceClaim, node string, written bool) *resourceapi.AllocationResult {
	f.t.Helper()
	a, err := f.sim.Allocator(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return f.allocateWith(a, claim, node, written)
}

func (f *fixture) allocateWith(a structured.Allocator, claim *resourceapi.ResourceClaim, node string, written bool) *resourceapi.AllocationResult {
	f.t.Helper()
	r, err := f.sim.AllocateWith(f.ctx, a, claim, node)
	if err != nil || r == nil {
		f.t.Fatalf("allocate %s on %s: %v", claim.Name, node, err)
	}
	allocated := claim.DeepCopy()
	allocated.Status.Allocation = r
	// The assume cache takes an update only with a newer version.
	allocated.ResourceVersion = "2"
	if !written {
		if err := f.dra.ResourceClaims().SignalClaimPendingAllocation(claim.UID, allocated); err != nil {
			f.t.Fatal(err)
		}
		return r
	}
	if _, err := f.client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(f.ctx, allocated, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	// The claim's cache and the allocated-device tracker that PreFilter
	// gathers from follow the informer each on its own: a score read
	// before the tracker has the devices would count them free.
	f.waitFor("the allocation of "+claim.Name, func() bool {
		c, err := f.dra.ResourceClaims().Get(claim.Namespace, claim.Name)
		if err != nil || c.Status.Allocation == nil {
			return false
		}
		gathered, err := f.dra.ResourceClaims().GatherAllocatedState()
		return err == nil && holds(gathered, r)
	})
	return r
}

// holds tells whether the allocated state has every device of an
// allocation, whole or as a share.
func holds(state *structured.AllocatedState, r *resourceapi.AllocationResult) bool {
	for _, res := range r.Devices.Results {
		id := schedulerapi.MakeDeviceID(res.Driver, res.Pool, res.Device)
		if !state.AllocatedDevices.Has(id) && !state.AllocatedSharedDeviceIDs.Has(schedulerapi.MakeSharedDeviceID(id, res.ShareID)) {
			return false
		}
	}
	return true
}

// snapshot is what the DynamicResources plugin's PreFilter reads for a
// cycle: the slices, DeviceTaintRules applied, and the allocated state.
func (f *fixture) snapshot() ([]*resourceapi.ResourceSlice, *structured.AllocatedState) {
	f.t.Helper()
	listed, err := f.dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		f.t.Fatal(err)
	}
	gathered, err := f.dra.ResourceClaims().GatherAllocatedState()
	if err != nil {
		f.t.Fatal(err)
	}
	return listed, gathered
}

// nodeInfos are the framework's views of the named nodes.
func nodeInfos(names ...string) []fwk.NodeInfo {
	out := make([]fwk.NodeInfo, len(names))
	for i, n := range names {
		ni := framework.NewNodeInfo()
		ni.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		out[i] = ni
	}
	return out
}
