// Package placement is kyb-scheduler's score for the driver's GPU seats,
// the framework plugin KybPlacement. Among the nodes that fit a pod (the
// DynamicResources plugin's Filter ran the allocator on each), it ranks
// them by what the pod's seats would take there, under a policy: pack
// (the default: nodes, then groups, already in use first, so that whole
// groups stay free elsewhere), topology (the node where the pod's group
// breaks the fewest idle larger groups, packing among equals) or spread.
// The policy comes from the pod's annotation gpu.kyb.ai/placement, else
// from the configuration (a per-DeviceClass map, then a default).
//
// It reads what the DynamicResources plugin reads, through the
// framework's SharedDRAManager: the ResourceSlices, the DeviceClasses,
// and the allocated state, which includes the claims of pods reserved but
// not yet bound; a second informer would lag behind a burst of pods and
// see none of those. The allocated state is the one the DynamicResources
// plugin's PreFilter gathered for the pod's cycle (kyb-scheduler's patch
// shares it), not a second copy. Everything is computed once per pod in
// PreScore, and Score is a map lookup: a node's pool is parsed once per
// version of its slices and a class's selectors evaluated once per
// version of class and pool; per pod the allocated state is read in one
// pass, and only the nodes whose allocations changed since they were
// last ordered and predicted are ordered and predicted again (view.go).
// No allocator runs here (see predict.go for why the Filter's own choice
// cannot be read).
//
// Pods that ask for DRA-served extended resources (KEP-5004,
// kyb.ai/gpu-1x-seat in limits) are scored the same way, through the
// DeviceClass that serves the resource.
package placement

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// Name is the plugin's name in the scheduler's configuration.
const Name = "KybPlacement"

const stateKey fwk.StateKey = Name

// gatherAttempts bounds the retries of the claim tracker's allocated
// state, which reports a concurrent change (a claim moving from in flight
// to the assume cache while it is read) instead of a torn view.
const gatherAttempts = 5

// Plugin is the score.
type Plugin struct {
	args  Args
	dra   fwk.SharedDRAManager
	pools poolCache
	cel   *cel.Cache
	// parallel predicts the nodes several at once, as the framework runs
	// Filter and Score; nil: one after the other.
	parallel fwk.Parallelizer
	// scratch holds *scratch, one per node predicted at a time; views,
	// *poolView, one per cycle.
	scratch, views sync.Pool
	// unordered says once that the profile runs the DynamicResources
	// PreFilter before ours.
	unordered sync.Once
	// metrics: nil records nothing.
	metrics *Metrics
}

var (
	_ fwk.PreFilterPlugin = &Plugin{}
	_ fwk.PreScorePlugin  = &Plugin{}
	_ fwk.ScorePlugin     = &Plugin{}
	_ fwk.ScoreExtensions = &Plugin{}
	_ fwk.SignPlugin      = &Plugin{}
)

// Factory returns the plugin's factory, for app.WithPlugin: every
// profile's plugin records its cost in m, and m's fragmentation is
// measured through the last one made (every profile's reads the
// scheduler's one DRA manager).
func Factory(m *Metrics) frameworkruntime.PluginFactory {
	return func(ctx context.Context, obj runtime.Object, fh fwk.Handle) (fwk.Plugin, error) {
		args, err := DecodeArgs(obj)
		if err != nil {
			return nil, err
		}
		dra := fh.SharedDRAManager()
		if dra == nil {
			return nil, fmt.Errorf("%s needs the scheduler's DRA manager: is the DynamicResourceAllocation feature gate off?", Name)
		}
		pl := NewWithManager(args, dra)
		pl.parallel = fh.Parallelizer()
		pl.metrics = m
		m.measureFrom(klog.FromContext(ctx), pl)
		return pl, nil
	}
}

// NewWithManager returns the plugin over a DRA manager: the scheduler's
// (New), or one over other informers.
func NewWithManager(args Args, dra fwk.SharedDRAManager) *Plugin {
	// The class selectors of a cluster are few; compiled once each.
	return &Plugin{args: args, dra: dra, cel: cel.NewCache(32, cel.Features{EnableConsumableCapacity: true})}
}

// Name returns the plugin's name.
func (pl *Plugin) Name() string { return Name }

// PreFilter leaves the pod's device order for the DynamicResources
// plugin's PreFilter, which runs after it where the profile enables
// KybPlacement at PreFilter explicitly (kyb-scheduler's built-in profile
// does): order.go. Pods that ask for none of our devices skip it.
func (pl *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	defer pl.metrics.since(stepPreFilter, time.Now())
	if !needsDevices(pod, pl.dra) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	reqs := cycleRequests(state, pod, pl.dra)
	if len(reqs) == 0 {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	policy, err := pl.args.podPolicy(pod.Annotations, classNames(reqs))
	if err != nil {
		// PreScore reports it; the allocator keeps the published order.
		return nil, fwk.NewStatus(fwk.Skip)
	}
	state.Write(dynamicresources.DeviceOrderKey, &deviceOrder{pl: pl, policy: policy, reqs: reqs})
	klog.FromContext(ctx).V(5).Info("Device order left for the allocator", "pod", klog.KObj(pod), "policy", policy)
	return nil, nil
}

// PreFilterExtensions: none, the order adds no node filter.
func (pl *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// orderApplied says whether the cycle's allocator tries devices in the
// pod's device order (and so the score predicts in that order).
func orderApplied(state fwk.CycleState) bool {
	o := cycleOrder(state)
	return o != nil && o.applied.Load() && o.policy != Spread
}

func cycleOrder(state fwk.CycleState) *deviceOrder {
	d, err := state.Read(dynamicresources.DeviceOrderKey)
	if err != nil {
		return nil
	}
	o, _ := d.(*deviceOrder)
	return o
}

// checkOrdered says, once, where the DynamicResources plugin's PreFilter
// ran before ours and so took no device order: a configuration of its
// own that enables KybPlacement without naming it at PreFilter.
func (pl *Plugin) checkOrdered(logger klog.Logger, state fwk.CycleState) {
	if o := cycleOrder(state); o != nil && o.policy != Spread && !o.applied.Load() {
		pl.unordered.Do(func() {
			logger.Info("The DynamicResources plugin's PreFilter ran before KybPlacement's: within a node the allocator takes devices in the published order, not the policy's. Enable KybPlacement under plugins.preFilter in the profile (docs/kyb-scheduler.md)", "policy", o.policy)
		})
	}
}

func (pl *Plugin) getScratch() *scratch {
	if s, ok := pl.scratch.Get().(*scratch); ok {
		return s
	}
	return &scratch{}
}

// scores are a pod's keys by node name, kept from PreScore for Score.
type scores struct {
	policy Policy
	keys   map[string]int64
}

func (s *scores) Clone() fwk.StateData { return s }

// PreScore predicts what the pod takes on each node that fits it, and
// keeps each node's key under the pod's policy. Pods that ask for none of
// our devices skip the score.
func (pl *Plugin) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	defer pl.metrics.since(stepPreScore, time.Now())
	logger := klog.FromContext(ctx)
	// Our PreFilter found the requests and the policy in this cycle; only
	// where it did not run first (or found none) are they looked up here.
	var reqs []request
	var policy Policy
	if o := cycleOrder(state); o != nil {
		reqs, policy = o.reqs, o.policy
	} else {
		if !needsDevices(pod, pl.dra) {
			return fwk.NewStatus(fwk.Skip)
		}
		reqs = cycleRequests(state, pod, pl.dra)
		if len(reqs) == 0 {
			return fwk.NewStatus(fwk.Skip)
		}
		var err error
		if policy, err = pl.args.podPolicy(pod.Annotations, classNames(reqs)); err != nil {
			return fwk.AsStatus(fmt.Errorf("pod %s: %w", klog.KObj(pod), err))
		}
	}
	pl.checkOrdered(logger, state)
	// The pools and their states the allocator got where the cycle
	// ordered them; else read here.
	var set *poolSet
	var states []*ordered
	ordered := false
	if o := cycleOrder(state); o != nil && o.applied.Load() && o.states != nil {
		set, states, ordered = o.set, o.states, o.policy != Spread
	} else {
		listed, err := pl.dra.ResourceSlices().ListWithDeviceTaintRules()
		if err != nil {
			return fwk.AsStatus(fmt.Errorf("list ResourceSlices: %w", err))
		}
		set = pl.pools.update(ctx, listed)
		allocated, err := pl.allocatedState(state)
		if err != nil {
			return fwk.AsStatus(err)
		}
		states = pl.poolStates(ctx, set, allocated)
	}
	key := predictionKey(reqs, ordered)
	outcomes := make([]outcome, len(nodes))
	// Nodes whose allocations are those of an earlier pod alike were
	// predicted then; only the others are predicted now.
	type node struct{ i, pool int }
	var todo []node
	for i, n := range nodes {
		k, ok := set.slot[n.Node().Name]
		if !ok {
			continue
		}
		if out, ok := states[k].prediction(key); ok {
			outcomes[i] = out
			continue
		}
		todo = append(todo, node{i: i, pool: k})
	}
	predictNode := func(j int) {
		n := todo[j]
		s := pl.getScratch()
		outcomes[n.i] = predict(ctx, pl.cel, set.list[n.pool], reqs, ordered, states[n.pool], s)
		pl.scratch.Put(s)
		states[n.pool].keep(key, outcomes[n.i])
	}
	if pl.parallel != nil && len(todo) > parallelFrom {
		pl.parallel.Until(ctx, len(todo), predictNode, Name)
	} else {
		for j := range todo {
			predictNode(j)
		}
	}
	s := &scores{policy: policy, keys: make(map[string]int64, len(nodes))}
	ours := false
	loggerV := logger.V(5)
	for i, o := range outcomes {
		name := nodes[i].Node().Name
		o = o.bounded(set.larger)
		s.keys[name] = o.key(policy)
		ours = ours || o.ours
		if loggerV.Enabled() && o.ours {
			loggerV.Info("Placement predicted", "pod", klog.KObj(pod), "node", name, "policy", policy, "key", s.keys[name],
				"predicted", o.predicted, "gpus", o.gpus, "busyGPUs", o.busy, "devices", o.picks, "joinedGroups", o.joined, "brokenGroups", o.broken, "sizedGroups", o.sized, "memoryLeftMiB", o.leftMiB)
		}
	}
	if !ours {
		return fwk.NewStatus(fwk.Skip)
	}
	logger.V(4).Info("Scoring GPU seats", "pod", klog.KObj(pod), "policy", policy, "nodes", len(nodes), "requests", len(reqs))
	state.Write(stateKey, s)
	return nil
}

// allocatedState is the state the DynamicResources plugin's PreFilter
// gathered for this cycle, which its Filter allocated against; gathered
// here only where PreFilter left none (it gathers only for a pod with
// claims still to allocate).
func (pl *Plugin) allocatedState(cycle fwk.CycleState) (*structured.AllocatedState, error) {
	if d, err := cycle.Read(dynamicresources.AllocatedStateKey); err == nil {
		if s, ok := d.(*dynamicresources.AllocatedStateData); ok && s.State != nil {
			return s.State, nil
		}
	}
	return pl.gatherAllocatedState()
}

// gatherAllocatedState gathers the scheduler's allocated state afresh.
func (pl *Plugin) gatherAllocatedState() (*structured.AllocatedState, error) {
	var err error
	for range gatherAttempts {
		var s *structured.AllocatedState
		if s, err = pl.dra.ResourceClaims().GatherAllocatedState(); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("gather the allocated devices: %w", err)
}

// Score returns the node's key from PreScore; NormalizeScore maps the
// keys onto 0..MaxScore.
func (pl *Plugin) Score(_ context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s, err := readScores(state)
	if err != nil {
		return 0, fwk.AsStatus(fmt.Errorf("pod %s: %w", klog.KObj(pod), err))
	}
	return s.keys[nodeInfo.Node().Name], nil
}

// ScoreExtensions returns the normalization.
func (pl *Plugin) ScoreExtensions() fwk.ScoreExtensions { return pl }

// NormalizeScore maps the keys linearly onto 0..MaxScore, the best
// node at the top and the worst at 0: a key orders the nodes, its scale
// means nothing to the other plugins' scores. All equal: 0, no
// preference.
func (pl *Plugin) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, list fwk.NodeScoreList) *fwk.Status {
	normalize(list)
	return nil
}

func normalize(list fwk.NodeScoreList) {
	if len(list) == 0 {
		return
	}
	lo, hi := list[0].Score, list[0].Score
	for _, s := range list {
		lo, hi = min(lo, s.Score), max(hi, s.Score)
	}
	for i := range list {
		if hi == lo {
			list[i].Score = 0
			continue
		}
		// Keys reach 2^62: the product takes 128 bits. Keys are never
		// negative, so that hi-lo fits an int64 and the quotient is at
		// most MaxScore.
		h, l := bits.Mul64(uint64(list[i].Score-lo), uint64(fwk.MaxScore))
		q, _ := bits.Div64(h, l, uint64(hi-lo))
		list[i].Score = int64(q)
	}
}

func readScores(state fwk.CycleState) (*scores, error) {
	d, err := state.Read(stateKey)
	if err != nil {
		return nil, fmt.Errorf("read %s state: %w", Name, err)
	}
	s, ok := d.(*scores)
	if !ok {
		return nil, fmt.Errorf("%s state is a %T", Name, d)
	}
	return s, nil
}

// SignPod refuses to sign pods that ask for devices: their score depends
// on the allocations, which every placement changes, so a result cannot
// be reused for the next pod alike (KEP-5598 batching). Other pods sign
// with nothing of ours, so that the profile's batching stays on for them.
func (pl *Plugin) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if needsDevices(pod, pl.dra) {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pods that ask for devices are scored on the allocations of the moment")
	}
	return nil, nil
}
