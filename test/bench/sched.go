package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// SchedOptions size the kube-scheduler study.
type SchedOptions struct {
	// Nodes of each shape: the study runs at each count, to show the
	// trend where the largest count is what the machine can hold.
	Nodes []int
	// Pods scheduled per shape and round onto empty nodes, one claim each.
	Pods   int
	Rounds int
	// BusyShare is the share of the nodes that are full before the pods
	// are released in the busy-cluster scenario; BusyFill is the share of
	// the other nodes' seats those pods take (the same share for every
	// shape, so that the last pods find as much room on each).
	BusyShare, BusyFill float64
	// Preset is our node.
	Preset string
	// Profile, when set, is a file prefix: the first round of the empty
	// nodes at the largest count is CPU-profiled per shape
	// (<prefix>-<shape>.pprof; the scheduler, API server and etcd share
	// the process).
	Profile string
}

// SchedStudy is the in-process kube-scheduler's throughput on both shapes,
// on empty nodes and on a busy cluster.
type SchedStudy struct {
	Options   SchedOptions
	Scenarios []*SchedScenario
	// Profiles are the CPU profiles written, per shape name.
	Profiles map[string]string
}

// SchedScenario is one situation the pods are released into, and the
// shapes measured in it; the first shape is the basis of the ratios.
type SchedScenario struct {
	Name   string
	Nodes  int
	Shapes []Shape
	// Full is how many of the nodes are full before the pods come; Pods
	// is how many pods come, per shape.
	Full int
	Pods []int
	// PodsPerSecond per round, per shape.
	PodsPerSecond [][]float64
	// Attempts per round, per shape: the scheduler's scheduling attempts
	// (scheduled, unschedulable or error) per pod after the release.
	Attempts [][]float64
}

// UpstreamBasicThreshold is scheduler_perf's pods/s threshold for its
// basic-devices workload at 500 nodes
// (SchedulingWithResourceClaimTemplate/5000pods_500nodes), on upstream's
// CI machines: 120 since Kubernetes 1.37 (kubernetes#138916), 56 before.
const UpstreamBasicThreshold = 120

// schedLabel selects the nodes a round's pods may run on: its own, which
// carry it from their creation.
const schedLabel = "bench.kyb.ai/round"

// RunSched measures the scheduler's throughput on nodes of each shape, at
// each node count: pods released onto empty nodes, and pods released onto
// a cluster most of whose nodes are full, where most Filter calls reject a
// full node. Our nodes publish every group (the plugin's default). Every
// round gets fresh nodes, and the shapes take turns, the first
// alternating.
func RunSched(ctx context.Context, c *harness.Cluster, opts SchedOptions) (*SchedStudy, error) {
	ours, err := KybShape(ctx, "ours ("+opts.Preset+", every group published: the default)", opts.Preset, "", "1x")
	if err != nil {
		return nil, err
	}
	basic := BasicShape()
	st := &SchedStudy{Options: opts, Profiles: map[string]string{}}
	largest := slices.Max(opts.Nodes)
	for _, n := range opts.Nodes {
		full := int(float64(n)*opts.BusyShare + 0.5)
		busyPods := func(s Shape) int { return int(float64((n-full)*s.PerNode)*opts.BusyFill + 0.5) }
		pods := min(opts.Pods, n*ours.PerNode/2)
		st.Scenarios = append(st.Scenarios,
			&SchedScenario{Name: "empty nodes", Nodes: n, Shapes: []Shape{basic, ours}, Pods: []int{pods, pods}},
			&SchedScenario{Name: fmt.Sprintf("busy: %d of %d nodes full", full, n), Nodes: n, Shapes: []Shape{basic, ours}, Full: full, Pods: []int{busyPods(basic), busyPods(ours)}})
	}
	for _, sc := range st.Scenarios {
		for i, s := range sc.Shapes {
			if free := (sc.Nodes - sc.Full) * s.PerNode; sc.Pods[i] > free || sc.Pods[i] < 20 {
				return nil, fmt.Errorf("scheduler study: %d pods for %d free nodes of %s: too many, or too few to measure", sc.Pods[i], sc.Nodes-sc.Full, s.Name)
			}
			for _, dc := range s.Classes {
				if _, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return nil, fmt.Errorf("create class %s: %w", dc.Name, err)
				}
			}
		}
	}
	for r := 0; r < opts.Rounds; r++ {
		for si, sc := range st.Scenarios {
			rates := make([]float64, len(sc.Shapes))
			attempts := make([]float64, len(sc.Shapes))
			for k := range sc.Shapes {
				// Rotate which shape goes first from round to round.
				i := (k + r) % len(sc.Shapes)
				profile := ""
				if opts.Profile != "" && r == 0 && sc.Full == 0 && sc.Nodes == largest {
					profile = fmt.Sprintf("%s-%s.pprof", opts.Profile, []string{"basic", "ours"}[i])
					st.Profiles[sc.Shapes[i].Name] = profile
				}
				res, err := schedRound(ctx, c, inProcessScheduler(), sc.Shapes[i], fmt.Sprintf("r%d-c%d-s%d", r, si, i), sc.Nodes, sc.Full, sc.Pods[i], profile)
				if err != nil {
					return nil, fmt.Errorf("round %d, %d nodes, %s, %s: %w", r, sc.Nodes, sc.Name, sc.Shapes[i].Name, err)
				}
				rates[i] = res.rate
				attempts[i] = res.attempts / float64(sc.Pods[i])
			}
			sc.PodsPerSecond = append(sc.PodsPerSecond, rates)
			sc.Attempts = append(sc.Attempts, attempts)
		}
	}
	return st, nil
}

// schedTarget is the scheduler a round's pods ask for, and how its
// scheduling attempts are counted.
type schedTarget struct {
	// name is the pods' spec.schedulerName; "" for the default scheduler.
	name string
	// attempts is the scheduler's scheduler_schedule_attempts_total, by
	// result (scheduled, unschedulable, error).
	attempts func(ctx context.Context) (map[string]float64, error)
	// costs, for a scheduler process, reads its times per cycle; nil for
	// the in-process scheduler.
	costs func(ctx context.Context) (cycleCosts, error)
	// cpu, for a scheduler process, reads the CPU seconds it has used
	// (process_cpu_seconds_total); nil for the in-process scheduler, which
	// shares its process with the API server.
	cpu func(ctx context.Context) (float64, error)
	// metrics, for a scheduler process, reads its metrics page; nil for
	// the in-process scheduler.
	metrics func(ctx context.Context) ([]byte, error)
	// cpuProfile, for a scheduler process, profiles its CPU over the next
	// seconds; nil for the in-process scheduler, which this process
	// profiles itself.
	cpuProfile func(ctx context.Context, seconds int) ([]byte, error)
}

// roundResult is what one round measured: pods/s, scheduling attempts,
// and the scheduler process's CPU seconds from the release to the last
// binding's attempt (0 in-process).
type roundResult struct {
	rate, attempts, cpu float64
}

// inProcessScheduler is the cluster's default scheduler, the stock
// kube-scheduler running in this process.
func inProcessScheduler() schedTarget {
	return schedTarget{attempts: func(context.Context) (map[string]float64, error) { return scheduleAttempts() }}
}

// total is the sum of attempts over results.
func total(byResult map[string]float64) float64 {
	n := 0.0
	for _, v := range byResult {
		n += v
	}
	return n
}

// schedRound creates n nodes of shape s with their slices, fills the first
// full of them (fillNodes), creates pods pods with one claim each for
// scheduler sched, releases them and returns the pods/s (from the release
// to the last binding) and the scheduler's attempts after the release:
// more attempts than pods are pods retried.
//
// The pods' claims ask for a DeviceClass of the round's own, a copy of the
// shape's, which does not exist until the release creates it: one event
// makes every pod schedulable on every node at once, so that the
// scheduler, not pod creation, sets the pace. Released by labelling the
// nodes one by one instead, the pods tried while the labels were being
// written saw only the nodes labelled so far, the more of them the faster
// the scheduler, and its DRA Filter calls and CPU per pod fell with them
// (upstream's basic shape under stock kube-scheduler, 100 empty nodes: 60
// Filter calls a pod, not 100). Pods/s counts from the release, not from
// the tenth binding: a scheduler binds behind its cycles, and its
// bindings can land in a burst at the end.
func schedRound(ctx context.Context, c *harness.Cluster, sched schedTarget, s Shape, id string, n, full, pods int, profile string) (roundResult, error) {
	ns := "sched-" + id
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return roundResult{}, err
	}
	nodes := make([]string, n)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-node-%03d", id, i)
	}
	labels := map[string]string{schedLabel: id}
	if err := parallel(ctx, len(nodes), func(i int) error { return createNode(ctx, c.Client, nodes[i], s, labels) }); err != nil {
		return roundResult{}, err
	}
	defer removeRound(context.WithoutCancel(ctx), c.Client, ns, nodes)
	class, err := roundClass(s, id)
	if err != nil {
		return roundResult{}, err
	}
	if err := fillNodes(ctx, c.Client, s, ns, nodes[:full]); err != nil {
		return roundResult{}, err
	}

	scheduled, stop, err := watchScheduled(c.Client, ns, pods)
	if err != nil {
		return roundResult{}, err
	}
	defer stop()

	before, err := createUnschedulable(ctx, c, sched, class.Name, ns, id, pods)
	if err != nil {
		return roundResult{}, err
	}
	cpuBefore, err := processCPU(ctx, sched)
	if err != nil {
		return roundResult{}, err
	}
	if profile != "" && sched.cpuProfile != nil {
		stop, err := profileProcess(ctx, sched.cpuProfile, profile)
		if err != nil {
			return roundResult{}, err
		}
		defer stop()
	} else if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return roundResult{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return roundResult{}, fmt.Errorf("profile the scheduler: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	released := time.Now()
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		return roundResult{}, fmt.Errorf("release the pods: create class %s: %w", class.Name, err)
	}
	defer func() {
		if err := c.Client.ResourceV1().DeviceClasses().Delete(context.WithoutCancel(ctx), class.Name, metav1.DeleteOptions{}); err != nil {
			klog.FromContext(ctx).Error(err, "Remove a round's class", "deviceClass", class.Name)
		}
	}()
	var times []time.Time
	timeout := time.After(time.Duration(pods)*100*time.Millisecond + time.Minute)
	for len(times) < pods {
		select {
		case t := <-scheduled:
			times = append(times, t)
		case <-timeout:
			return roundResult{}, fmt.Errorf("only %d of %d pods were scheduled", len(times), pods)
		case <-ctx.Done():
			return roundResult{}, ctx.Err()
		}
	}
	after, err := sched.attempts(ctx)
	if err != nil {
		return roundResult{}, err
	}
	cpuAfter, err := processCPU(ctx, sched)
	if err != nil {
		return roundResult{}, err
	}
	return roundResult{
		rate:     float64(len(times)) / times[len(times)-1].Sub(released).Seconds(),
		attempts: total(after) - total(before),
		cpu:      cpuAfter - cpuBefore,
	}, nil
}

// profileProcess profiles a scheduler process's CPU, one second at a
// time until stop, into dir (made here): a profile's length must be given
// when it starts, and a round's is not known. `go tool pprof dir/*`
// merges the windows. stop waits for the last window.
func profileProcess(ctx context.Context, cpuProfile func(context.Context, int) ([]byte, error), dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	logger := klog.FromContext(ctx)
	go func() {
		defer close(finished)
		for w := 0; ; w++ {
			select {
			case <-done:
				return
			default:
			}
			data, err := cpuProfile(ctx, 1)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("w%03d.pprof", w)), data, 0o644)
			}
			if err != nil {
				logger.Error(err, "Profile the scheduler", "dir", dir)
				return
			}
		}
	}()
	return func() { close(done); <-finished }, nil
}

// processCPU is the CPU seconds a scheduler process has used so far, 0
// for the in-process scheduler.
func processCPU(ctx context.Context, sched schedTarget) (float64, error) {
	if sched.cpu == nil {
		return 0, nil
	}
	return sched.cpu(ctx)
}

// createUnschedulable creates pods pods of round id with a claim each
// for sched, and returns once the scheduler has tried each of them (and
// found no node: their class does not exist yet, or no node has the
// round's label yet), with its attempts then.
// A fixed wait would, on a loaded machine, let some first attempts fall
// after the release and count them as retries.
func createUnschedulable(ctx context.Context, c *harness.Cluster, sched schedTarget, class, ns, id string, pods int) (map[string]float64, error) {
	base, err := sched.attempts(ctx)
	if err != nil {
		return nil, err
	}
	if err := parallel(ctx, pods, func(i int) error {
		return createPod(ctx, c.Client, ns, fmt.Sprintf("p%04d", i), class, id, sched.name)
	}); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		cur, err := sched.attempts(ctx)
		if err != nil {
			return nil, err
		}
		if tried := total(cur) - total(base); tried >= float64(pods) {
			return cur, nil
		} else if time.Now().After(deadline) {
			return nil, fmt.Errorf("the scheduler tried %.0f of %d new pods in a minute", tried, pods)
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// watchScheduled sends the time each pod of ns is first seen bound to a
// node, for up to pods pods, until stop.
func watchScheduled(client kubernetes.Interface, ns string, pods int) (<-chan time.Time, func(), error) {
	scheduled := make(chan time.Time, pods)
	inf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	seen := sync.Map{}
	podInf := inf.Core().V1().Pods().Informer()
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, obj any) {
		if pod, ok := obj.(*v1.Pod); ok && pod.Spec.NodeName != "" {
			if _, dup := seen.LoadOrStore(pod.UID, true); !dup {
				scheduled <- time.Now()
			}
		}
	}}); err != nil {
		return nil, nil, fmt.Errorf("watch the pods of %s: %w", ns, err)
	}
	stop := make(chan struct{})
	inf.Start(stop)
	inf.WaitForCacheSync(stop)
	return scheduled, func() { close(stop); inf.Shutdown() }, nil
}

// removeRound deletes what a round created: its nodes (the next round's
// pods must not land there), their slices, and its pods and claims. No
// garbage collector runs here, so what is left would stay, and every
// later round's scheduler would walk it: the rounds would not be alike.
func removeRound(ctx context.Context, client kubernetes.Interface, ns string, nodes []string) {
	logger := klog.FromContext(ctx)
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	if err := client.CoreV1().Pods(ns).DeleteCollection(ctx, now, metav1.ListOptions{}); err != nil {
		logger.Error(err, "Remove a round's pods", "namespace", ns)
	}
	// The scheduler puts a finalizer on the claims it allocates, which
	// only the claim controller (not running here) takes off.
	claims, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		logger.Error(err, "List a round's claims", "namespace", ns)
	} else if err := parallel(ctx, len(claims.Items), func(i int) error {
		name := claims.Items[i].Name
		if _, err := client.ResourceV1().ResourceClaims(ns).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("claim %s: %w", name, err)
		}
		return client.ResourceV1().ResourceClaims(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}); err != nil {
		logger.Error(err, "Remove a round's claims", "namespace", ns)
	}
	if err := parallel(ctx, len(nodes), func(i int) error {
		if err := client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + nodes[i]}); err != nil {
			return fmt.Errorf("slices of node %s: %w", nodes[i], err)
		}
		return client.CoreV1().Nodes().Delete(ctx, nodes[i], metav1.DeleteOptions{})
	}); err != nil {
		logger.Error(err, "Remove a round's nodes", "namespace", ns)
	}
}

func createNode(ctx context.Context, client kubernetes.Interface, name string, s Shape, labels map[string]string) error {
	if err := harness.CreateReadyNode(ctx, client, name, labels); err != nil {
		return err
	}
	for _, rs := range sliceObjects(s.Driver, s.Resources(name), name) {
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, rs, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("node %s: create slice: %w", name, err)
		}
	}
	return nil
}

// sliceObjects renders a node's pool as ResourceSlices.
func sliceObjects(driver string, res resourceslice.DriverResources, node string) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for poolName, pool := range res.Pools {
		for i, s := range pool.Slices {
			rs := &resourceapi.ResourceSlice{}
			rs.GenerateName = fmt.Sprintf("%s-%s-%d-", node, driver, i)
			rs.Spec = resourceapi.ResourceSliceSpec{
				Driver:         driver,
				Pool:           resourceapi.ResourcePool{Name: poolName, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName:       &node,
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			}
			out = append(out, rs)
		}
	}
	return out
}

func createPod(ctx context.Context, client kubernetes.Interface, ns, name, class, round, scheduler string) error {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}
	if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create claim %s: %w", name, err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	pod.Spec.NodeSelector = map[string]string{schedLabel: round}
	pod.Spec.SchedulerName = scheduler
	pod.Spec.Containers = []v1.Container{{Name: "c", Image: "pause", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	return nil
}

// parallel runs f for 0..n-1 on a few workers and returns the first error.
func parallel(ctx context.Context, n int, f func(i int) error) error {
	next := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// Table summarises the study.
func (st *SchedStudy) Table() *Table {
	t := &Table{
		Title:  fmt.Sprintf("kube-scheduler (in-process) steady-state throughput, %v nodes per shape (median of %d rounds)", st.Options.Nodes, st.Options.Rounds),
		Header: []string{"nodes", "pods released onto", "shape", "pods", "pods/s", "ratio to basic", "scheduling attempts per pod", "nodes' claims taken at the end"},
	}
	for _, sc := range st.Scenarios {
		for i, s := range sc.Shapes {
			var rates, ratios, attempts []float64
			for r, rs := range sc.PodsPerSecond {
				rates = append(rates, rs[i])
				ratios = append(ratios, rs[i]/rs[0])
				attempts = append(attempts, sc.Attempts[r][i])
			}
			fill := float64(sc.Full*s.PerNode+sc.Pods[i]) / float64(sc.Nodes*s.PerNode)
			t.Rows = append(t.Rows, []string{fmt.Sprint(sc.Nodes), sc.Name, s.Name, fmt.Sprint(sc.Pods[i]), fmt.Sprintf("%.0f", Median(rates)), Ratio(Median(ratios)), fmt.Sprintf("%.2f", Median(attempts)), fmt.Sprintf("%.0f %%", 100*fill)})
		}
	}
	t.Notes = []string{fmt.Sprintf("Each pod has its own ResourceClaim for one device (ours: a 1x seat); the pods are created unschedulable "+
		"and released at once by creating the DeviceClass their claims ask for (a copy of the shape's under a name of the round's own); "+
		"pods/s from the release to the last binding. Busy: before the pods come, the "+
		"scheduler's own allocator fills the first nodes, the claims are written to the API server as allocated, and each full node is "+
		"published as the plugin publishes it once those claims are prepared; the pods then take %.0f %% of the other nodes' seats. Scheduling attempts per pod "+
		"above 1 are pods retried. The scheduler has a client of its own at QPS 5000, as in upstream's scheduler_perf; it, the API server and etcd share "+
		"this machine's CPUs. Upstream's scheduler_perf threshold for its basic shape at 500 nodes (5000pods_500nodes) is %d pods/s "+
		"on its CI machines since Kubernetes 1.37.",
		100*st.Options.BusyFill, UpstreamBasicThreshold)}
	return t
}

// scheduleAttempts is the in-process scheduler's
// scheduler_schedule_attempts_total by result, summed over profiles.
func scheduleAttempts() (map[string]float64, error) {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather the scheduler's metrics: %w", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "scheduler_schedule_attempts_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			result := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					result = l.GetValue()
				}
			}
			out[result] += m.GetCounter().GetValue()
		}
	}
	return out, nil
}

// roundClass is the class a round's pods ask for: s's, under a name of the
// round's own (schedRound).
func roundClass(s Shape, id string) (*resourceapi.DeviceClass, error) {
	for _, dc := range s.Classes {
		if dc.Name == s.Class {
			class := &resourceapi.DeviceClass{Spec: *dc.Spec.DeepCopy()}
			class.Name = id + "-" + dc.Name
			return class, nil
		}
	}
	return nil, fmt.Errorf("shape %s has no class %s", s.Name, s.Class)
}
