package room

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	resourceslicetracker "k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	kubeschedulerconfigv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	configv1 "k8s.io/kubernetes/pkg/scheduler/apis/config/v1"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/tainttoleration"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	gpuinventory "github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// The fixture is a cluster as kube-scheduler's framework sees it:
// simulated dgx-h100 nodes' slices as the driver's plugin publishes them
// (pkg/draresources: a device per group of 1, 2 and 4 GPUs, overlapping
// through one counter per GPU), the DeviceClasses, and running pods
// whose claims hold seats, in a fake API server, read through the
// scheduler's real DRA manager. A real framework runs the real
// DynamicResources plugin (kyb-scheduler's patched one, whose allocator
// is the Filter) and KybPreemption, and evicts through the fake API.

const (
	class1x = "gpu-1x-seat.kyb.ai"
	class2x = "gpu-2x-seat.kyb.ai"
	class4x = "gpu-4x-seat.kyb.ai"
)

// threeProfiles is one seat per group of 1, 2 and 4 GPUs: every seat is
// an ordinary device.
const threeProfiles = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-4x-seat}
`

// sharedProfiles has groups of two seats: a 1x seat is a share.
const sharedProfiles = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2}
- {resource: kyb.ai/gpu-4x-seat}
`

type fixture struct {
	t      *testing.T
	ctx    context.Context
	fts    feature.Features
	sim    *schedulertest.Cluster
	client *fake.Clientset

	classes   []*resourceapi.DeviceClass
	nodes     []*v1.Node
	pods      []*v1.Pod
	claims    []*resourceapi.ResourceClaim
	pdbs      []*policyv1.PodDisruptionBudget
	podGroups []*schedulingv1beta1.PodGroup
	nominator *nominator
	activator *activator

	// After start:
	dra      *dynamicresources.DefaultDRAManager
	fw       framework.Framework
	snapshot *internalcache.Snapshot
	// stock runs kube-scheduler's DefaultPreemption instead; with
	// stockReleases, KybPreemption's RemovePod and AddPod release claims
	// for it.
	stock, stockReleases bool
	// mutating is set once forget changed the snapshot.
	mutating bool
	// beforePostFilter, if set, runs between a cycle's Filter and its
	// PostFilter.
	beforePostFilter func()
	// defrag is the plugin's defragmentation.
	defrag Defragmentation
	// events are those the framework's recorder got; plugin is
	// KybPreemption, once started.
	events *eventLog
	plugin *Preemption
	// evicted are the pods evicted through the Eviction API, in order.
	evicted []string
}

func newFixture(t *testing.T, config string, nodes ...string) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	// Evictions in the cycle, so that a test reads them when PostFilter
	// returns.
	fts.EnableAsyncPreemption = false
	f := &fixture{t: t, ctx: ctx, fts: fts, client: fake.NewClientset(), sim: schedulertest.New(schedulertest.SchedulerFeatures()), nominator: &nominator{}, activator: &activator{}, events: &eventLog{}}
	// The Eviction API deletes the pod (the fixture's pods have no
	// budgets the API server would check: the search checks them).
	f.client.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		e := action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		f.evicted = append(f.evicted, e.Name)
		return true, nil, f.client.Tracker().Delete(v1.SchemeGroupVersion.WithResource("pods"), e.Namespace, e.Name)
	})
	sim, err := simnode.Load("dgx-h100", "node")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := gpuinventory.Discover(ctx, sim.NVML(), sim.PCIe())
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(config), "test config")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		f.sim.AddNode(n, draresources.Resources(plan, inv, n, draresources.LayoutShared), driver.Name)
		f.nodes = append(f.nodes, &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/hostname": n}},
			Status: v1.NodeStatus{Allocatable: v1.ResourceList{
				v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi"), v1.ResourcePods: resource.MustParse("110"),
			}},
		})
	}
	for _, dc := range draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{ExtendedResources: true}) {
		f.classes = append(f.classes, dc)
		f.sim.AddClasses(dc)
	}
	return f
}

// start creates the objects in the API server, syncs the scheduler's
// caches and builds the framework with KybPreemption (or DefaultPreemption
// where stock).
func (f *fixture) start() {
	f.t.Helper()
	t, ctx := f.t, f.ctx
	for _, s := range f.sim.Slices() {
		f.create(s.DeepCopy())
	}
	for _, dc := range f.classes {
		f.create(dc)
	}
	for _, c := range f.claims {
		f.create(c)
	}
	for _, p := range f.pods {
		f.create(p)
	}
	for _, p := range f.pdbs {
		f.create(p)
	}
	for _, pg := range f.podGroups {
		f.create(pg)
	}
	for _, n := range f.nodes {
		f.create(n)
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
	if _, err := factory.Resource().V1().DeviceClasses().Informer().AddEventHandler(f.dra.DeviceClassResolver().(*extendedresourcecache.ExtendedResourceCache)); err != nil {
		t.Fatal(err)
	}
	podGroupManager := internalcache.New(ctx, nil, f.fts.EnableGenericWorkload, false)
	for _, pg := range f.podGroups {
		podGroupManager.AddPodGroup(pg)
	}
	for _, p := range f.pods {
		podGroupManager.AddPodGroupMember(p)
	}
	f.snapshot = internalcache.NewTestSnapshotWithPodGroups(f.pods, f.nodes, f.podGroups)

	fts := f.fts
	preemptionName := Name
	registry := frameworkruntime.Registry{
		queuesort.Name:        queuesort.New,
		defaultbinder.Name:    defaultbinder.New,
		dynamicresources.Name: frameworkruntime.FactoryAdapter(fts, dynamicresources.New),
		tainttoleration.Name:  frameworkruntime.FactoryAdapter(fts, tainttoleration.New),
		Name: func(ctx context.Context, obj runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
			pl, err := New(ctx, obj, fh, fts, f.defrag)
			f.plugin = pl
			return pl, err
		},
		defaultpreemption.Name: func(ctx context.Context, obj runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
			return defaultpreemption.New(ctx, defaultPreemptionArgs(), fh, fts)
		},
	}
	preFilter := []config.Plugin{{Name: dynamicresources.Name}, {Name: Name}}
	if f.stock {
		preemptionName = defaultpreemption.Name
		if !f.stockReleases {
			preFilter = preFilter[:1]
		}
	}
	draArgs := &kubeschedulerconfigv1.DynamicResourcesArgs{}
	configv1.SetDefaults_DynamicResourcesArgs(draArgs)
	args := &config.DynamicResourcesArgs{}
	if err := configv1.Convert_v1_DynamicResourcesArgs_To_config_DynamicResourcesArgs(draArgs, args, nil); err != nil {
		t.Fatal(err)
	}
	profile := &config.KubeSchedulerProfile{
		SchedulerName: "kyb-scheduler",
		Plugins: &config.Plugins{
			QueueSort:  config.PluginSet{Enabled: []config.Plugin{{Name: queuesort.Name}}},
			PreFilter:  config.PluginSet{Enabled: preFilter},
			Filter:     config.PluginSet{Enabled: []config.Plugin{{Name: tainttoleration.Name}, {Name: dynamicresources.Name}}},
			PostFilter: config.PluginSet{Enabled: []config.Plugin{{Name: dynamicresources.Name}, {Name: preemptionName}}},
			Reserve:    config.PluginSet{Enabled: []config.Plugin{{Name: dynamicresources.Name}}},
			Bind:       config.PluginSet{Enabled: []config.Plugin{{Name: defaultbinder.Name}}},
		},
		PluginConfig: []config.PluginConfig{{Name: dynamicresources.Name, Args: args}},
	}
	f.fw, err = frameworkruntime.NewFramework(ctx, registry, profile,
		frameworkruntime.WithClientSet(f.client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithEventRecorder(f.events),
		frameworkruntime.WithSharedDRAManager(f.dra),
		frameworkruntime.WithPodGroupManager(podGroupManager),
		frameworkruntime.WithSnapshotSharedLister(f.snapshot),
		frameworkruntime.WithMutableSnapshotLister(f.snapshot),
		frameworkruntime.WithPodNominator(f.nominator),
		frameworkruntime.WithPodActivator(f.activator),
		frameworkruntime.WithLogger(klog.FromContext(ctx)),
		frameworkruntime.WithWaitingPods(frameworkruntime.NewWaitingPodsMap()),
		frameworkruntime.WithPodsInPreBind(frameworkruntime.NewPodsInPreBindMap()),
	)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	f.waitFor("the slices", func() bool {
		s, err := f.dra.ResourceSlices().ListWithDeviceTaintRules()
		return err == nil && len(s) == len(f.sim.Slices())
	})
	f.waitFor("the classes", func() bool { return f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/gpu-1x-seat") != nil })
	for _, c := range f.claims {
		f.waitFor("claim "+c.Name, func() bool { _, err := f.dra.ResourceClaims().Get(c.Namespace, c.Name); return err == nil })
	}
}

func defaultPreemptionArgs() *config.DefaultPreemptionArgs {
	return &config.DefaultPreemptionArgs{MinCandidateNodesPercentage: 10, MinCandidateNodesAbsolute: 100}
}

func (f *fixture) create(obj runtime.Object) {
	f.t.Helper()
	var err error
	switch o := obj.(type) {
	case *resourceapi.ResourceSlice:
		_, err = f.client.ResourceV1().ResourceSlices().Create(f.ctx, o, metav1.CreateOptions{})
	case *resourceapi.DeviceClass:
		_, err = f.client.ResourceV1().DeviceClasses().Create(f.ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceClaim:
		_, err = f.client.ResourceV1().ResourceClaims(o.Namespace).Create(f.ctx, o, metav1.CreateOptions{})
	case *v1.Pod:
		_, err = f.client.CoreV1().Pods(o.Namespace).Create(f.ctx, o, metav1.CreateOptions{})
	case *v1.Node:
		_, err = f.client.CoreV1().Nodes().Create(f.ctx, o, metav1.CreateOptions{})
	case *policyv1.PodDisruptionBudget:
		_, err = f.client.PolicyV1().PodDisruptionBudgets(o.Namespace).Create(f.ctx, o, metav1.CreateOptions{})
	case *schedulingv1beta1.PodGroup:
		_, err = f.client.SchedulingV1beta1().PodGroups(o.Namespace).Create(f.ctx, o, metav1.CreateOptions{})
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

// pending creates a pod for the scheduler, with a claim of its own for
// count devices of class, not allocated, or none where class is empty.
func (f *fixture) pending(name, class string, count int64, opts ...podOpt) *v1.Pod {
	f.t.Helper()
	pod := newPod(name, opts...)
	if class != "" {
		claim := schedulertest.Claim(name+"-gpu", class, count)
		f.create(claim)
		f.waitFor("claim "+claim.Name, func() bool { _, err := f.dra.ResourceClaims().Get(claim.Namespace, claim.Name); return err == nil })
		withClaim(pod, claim.Name)
	}
	return f.submit(pod)
}

func (f *fixture) submit(pod *v1.Pod) *v1.Pod {
	f.t.Helper()
	f.create(pod)
	lister := f.fw.SharedInformerFactory().Core().V1().Pods().Lister()
	f.waitFor("pod "+pod.Name, func() bool { _, err := lister.Pods(pod.Namespace).Get(pod.Name); return err == nil })
	return pod
}

// outcome is what a scheduling cycle that ends in PostFilter did.
type outcome struct {
	nominated string
	victims   []string
	status    *fwk.Status
}

// schedule runs a pod's cycle up to PostFilter, as kube-scheduler does:
// PreFilter, Filter on every node (with the nominated pods), and, where
// no node fits, PostFilter. It returns the node that fits (without
// preemption), or the preemption's outcome.
func (f *fixture) schedule(pod *v1.Pod) (fits []string, out outcome, state fwk.CycleState) {
	f.t.Helper()
	state = framework.NewCycleState()
	if _, st, _ := f.fw.RunPreFilterPlugins(f.ctx, state, pod); !st.IsSuccess() {
		f.t.Fatalf("PreFilter %s: %v", pod.Name, st)
	}
	m := framework.NewDefaultNodeToStatus()
	infos, err := f.snapshot.NodeInfos().List()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, ni := range infos {
		st := f.fw.RunFilterPluginsWithNominatedPods(f.ctx, state, pod, ni)
		if st.IsSuccess() {
			fits = append(fits, ni.Node().Name)
			continue
		}
		if !st.IsRejected() {
			f.t.Fatalf("Filter %s on %s: %v", pod.Name, ni.Node().Name, st)
		}
		m.Set(ni.Node().Name, st)
	}
	slices.Sort(fits)
	if len(fits) > 0 {
		return fits, outcome{}, state
	}
	if f.beforePostFilter != nil {
		f.beforePostFilter()
	}
	before := f.podNames()
	result, st := f.fw.RunPostFilterPlugins(f.ctx, state, pod, m)
	out.status = st
	if result != nil && result.NominatingInfo != nil {
		out.nominated = result.NominatedNodeName
	}
	after := f.podNames()
	for _, n := range before {
		if !slices.Contains(after, n) {
			out.victims = append(out.victims, n)
		}
	}
	if out.nominated != "" {
		f.nominator.add(pod, out.nominated)
	}
	return nil, out, state
}

// preempt schedules a pod that fits nowhere and returns the preemption's
// outcome.
func (f *fixture) preempt(pod *v1.Pod) outcome {
	f.t.Helper()
	fits, out, _ := f.schedule(pod)
	if len(fits) > 0 {
		f.t.Fatalf("%s fits %v without preemption", pod.Name, fits)
	}
	return out
}

func (f *fixture) podNames() []string {
	f.t.Helper()
	list, err := f.client.CoreV1().Pods("default").List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// release deletes the victims' claims, as the resource-claim controller
// does once they are gone, and waits until the scheduler sees them gone.
func (f *fixture) release(pods ...string) {
	f.t.Helper()
	for _, name := range pods {
		for _, c := range f.claims {
			for _, r := range c.Status.ReservedFor {
				if r.Name != name {
					continue
				}
				if err := f.client.ResourceV1().ResourceClaims(c.Namespace).Delete(f.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
					f.t.Fatal(err)
				}
				f.waitFor("claim "+c.Name+" gone", func() bool { _, err := f.dra.ResourceClaims().Get(c.Namespace, c.Name); return err != nil })
			}
		}
	}
}

// nominator is the scheduling queue's record of nominated pods, as the
// framework reads it.
type nominator struct {
	mu     sync.Mutex
	byNode map[string][]fwk.PodInfo
}

func (n *nominator) add(pod *v1.Pod, node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byNode == nil {
		n.byNode = map[string][]fwk.PodInfo{}
	}
	p := pod.DeepCopy()
	p.Status.NominatedNodeName = node
	pi, _ := framework.NewPodInfo(p)
	n.byNode[node] = append(n.byNode[node], pi)
}

func (n *nominator) AddNominatedPod(_ klog.Logger, pi fwk.PodInfo, ni *fwk.NominatingInfo) {
	if ni != nil && ni.NominatedNodeName != "" {
		n.add(pi.GetPod(), ni.NominatedNodeName)
	}
}
func (n *nominator) DeleteNominatedPodIfExists(*v1.Pod)                   {}
func (n *nominator) UpdateNominatedPod(klog.Logger, *v1.Pod, fwk.PodInfo) {}
func (n *nominator) NominatedPodsForNode(node string) []fwk.PodInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.byNode[node])
}

// reserve runs Reserve for a pod that fits node, as the scheduler does for
// the node it picks, and returns the device the DynamicResources plugin
// took for the pod's first claim (in flight), then un-reserves it.
func (f *fixture) reserve(state fwk.CycleState, pod *v1.Pod, node string) string {
	f.t.Helper()
	if st := f.fw.RunReservePluginsReserve(f.ctx, state, pod, node); !st.IsSuccess() {
		f.t.Fatalf("Reserve %s on %s: %v", pod.Name, node, st)
	}
	defer f.fw.RunReservePluginsUnreserve(f.ctx, state, pod, node)
	claim, err := f.dra.ResourceClaims().Get(pod.Namespace, *pod.Spec.ResourceClaims[0].ResourceClaimName)
	if err != nil {
		f.t.Fatal(err)
	}
	a := f.dra.ResourceClaims().GetPendingAllocation(claim.UID)
	if a == nil || len(a.Devices.Results) == 0 {
		f.t.Fatalf("Reserve left %s no allocation in flight", claim.Name)
	}
	return a.Devices.Results[0].Device
}

// forget removes pods from the scheduler's snapshot, as the next cycle's
// snapshot has them gone once deleted. The snapshot stays mutated for
// the rest of the test.
func (f *fixture) forget(pods ...string) {
	f.t.Helper()
	if !f.mutating {
		if err := f.snapshot.StartMutations(); err != nil {
			f.t.Fatal(err)
		}
		f.mutating = true
	}
	for _, name := range pods {
		for _, p := range f.pods {
			if p.Name == name {
				if err := f.snapshot.RemovePod(klog.FromContext(f.ctx), p, p.Spec.NodeName); err != nil {
					f.t.Fatal(err)
				}
			}
		}
	}
}

// activator records the pods the framework activates.
type activator struct {
	mu   sync.Mutex
	pods []string
}

func (a *activator) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range pods {
		a.pods = append(a.pods, p.Name)
	}
}

func (a *activator) activated() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.pods)
}

// eventLog records the events the framework's recorder gets.
type eventLog struct {
	mu   sync.Mutex
	list []event
}

type event struct {
	regarding, related, reason, note string
}

func (e *eventLog) Eventf(regarding runtime.Object, related runtime.Object, _, reason, _, note string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev := event{reason: reason, note: fmt.Sprintf(note, args...)}
	if o, ok := regarding.(metav1.Object); ok {
		ev.regarding = o.GetName()
	}
	if o, ok := related.(metav1.Object); ok && related != nil {
		ev.related = o.GetName()
	}
	e.list = append(e.list, ev)
}

func (e *eventLog) WithLogger(klog.Logger) events.EventRecorderLogger { return e }

// with are the events of a reason.
func (e *eventLog) with(reason string) []event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []event
	for _, ev := range e.list {
		if ev.reason == reason {
			out = append(out, ev)
		}
	}
	return out
}
