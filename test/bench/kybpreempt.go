package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// The preemption study: nodes of our shape (one seat per group of 1, 2
// and 4 GPUs) full of low-priority pods, each GPU pair held by one 2x
// seat or by two 1x seats, chosen at random (a pair is one 2x seat with
// PreemptPair2x). High-priority pods asking for a 4x seat arrive one
// after the other: none fits without evicting. The fewest possible
// victims of one is the fewest low-priority pods on one four-GPU group of
// any node (two where both its pairs are 2x seats); the study counts
// each preemption's against it, and times each pod from its creation to
// its binding. The evicted pods go as on a cluster: a stand-in for the
// kubelet confirms their deletion (no kubelet runs here), and the
// resource-claim controller releases their claims.

// PreemptPair2x is the chance that a GPU pair is held by a 2x seat.
const PreemptPair2x = 0.15

// KybPreemptStudy is the preemption study's results per scheduler.
type KybPreemptStudy struct {
	Options KybSchedOptions
	Results []*KybPreemptResult
}

// KybPreemptResult is one scheduler's preemptions, over all rounds.
type KybPreemptResult struct {
	Scheduler string
	// Per preemptor: the time from its creation to its binding (0: not
	// bound within the wait), the pods evicted for it, and the fewest
	// possible when it arrived.
	Bound   []time.Duration
	Victims []int
	Fewest  []int
	// Pending says why a pod not bound was not: its PodScheduled
	// condition.
	Pending []string
	// Evaluations are the scheduler's preemption evaluations that
	// nominated a node (its scheduler_preemption_evaluation_duration_seconds
	// with result Success), and Evaluating their time in all; none read
	// for a scheduler in this process.
	Evaluations int
	Evaluating  time.Duration
}

// RunKybPreempt runs the preemption study: opts.PreemptNodes full nodes,
// opts.Preemptions high-priority 4x pods under kyb-scheduler, one under
// stock kube-scheduler (which preempts none for claims), each round.
func RunKybPreempt(ctx context.Context, c *harness.Cluster, opts KybSchedOptions) (*KybPreemptStudy, error) {
	plan, inv, _, err := Plan(ctx, opts.Preset, "node-0", "")
	if err != nil {
		return nil, err
	}
	classes := draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{})
	shape := Shape{Name: "ours (" + opts.Preset + ", one seat per group)", Driver: driver.Name, Classes: classes,
		Resources: func(node string) resourceslice.DriverResources {
			return draresources.Resources(plan, inv, node, draresources.LayoutShared)
		}}
	if err := createClasses(ctx, c, shape); err != nil {
		return nil, err
	}
	for name, value := range map[string]int32{preemptLow: 0, preemptHigh: 1000} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := c.Client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create PriorityClass %s: %w", name, err)
		}
	}
	st := &KybPreemptStudy{Options: opts}
	scheds := []schedulerUnderTest{stockScheduler(opts), kybScheduler(opts, true)}
	for _, s := range scheds {
		st.Results = append(st.Results, &KybPreemptResult{Scheduler: s.Name})
	}
	for round := 0; round < opts.Rounds; round++ {
		for k := range scheds {
			i := (k + round) % len(scheds)
			id := fmt.Sprintf("p%d-s%d", round, i)
			preemptions := opts.Preemptions
			if i == 0 {
				// Stock kube-scheduler frees no device: one pod shows it.
				preemptions = 1
			}
			err := func() error {
				target, stop := scheds[i].start(ctx, c, id)
				defer stop()
				r := preemptRound{c: c, s: shape, sched: target, id: id, ns: "preempt-" + id, opts: opts, seed: uint64(round)}
				return r.run(ctx, preemptions, st.Results[i])
			}()
			if err != nil {
				return nil, fmt.Errorf("preemption round %d, %s: %w", round, scheds[i].Name, err)
			}
		}
	}
	return st, nil
}

const (
	preemptLow  = "kyb-bench-low"
	preemptHigh = "kyb-bench-high"
)

type preemptRound struct {
	c     *harness.Cluster
	s     Shape
	sched schedTarget
	id    string
	ns    string
	opts  KybSchedOptions
	seed  uint64

	mu sync.Mutex
	// gpus are the GPUs each low-priority pod's seat holds, by node and
	// pod; gone are the pods deleted.
	gpus map[string]map[string][]int
	gone []string
}

func (r *preemptRound) run(ctx context.Context, preemptions int, res *KybPreemptResult) error {
	client := r.c.Client
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	nodes := make([]string, r.opts.PreemptNodes)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-node-%03d", r.id, i)
	}
	defer removeRound(context.WithoutCancel(ctx), client, r.ns, nodes)
	if err := parallel(ctx, len(nodes), func(i int) error { return createNode(ctx, client, nodes[i], r.s, nil) }); err != nil {
		return err
	}
	stopKubelet, err := r.standInKubelet(client)
	if err != nil {
		return err
	}
	defer stopKubelet()
	r.gpus = map[string]map[string][]int{}
	rng := rand.New(rand.NewPCG(r.seed, 47))
	layouts := make([][]bool, len(nodes))
	for i := range layouts {
		for range 4 {
			layouts[i] = append(layouts[i], rng.Float64() < PreemptPair2x)
		}
	}
	if err := parallel(ctx, len(nodes), func(i int) error { return r.fill(ctx, nodes[i], layouts[i]) }); err != nil {
		return err
	}
	scheduled, stop, err := watchBound(client, r.ns, "train-", preemptions)
	if err != nil {
		return err
	}
	defer stop()
	for k := range preemptions {
		fewest := r.fewest()
		gone := len(r.deleted())
		name := fmt.Sprintf("train-%d", k)
		created := time.Now()
		if err := r.createPreemptor(ctx, name); err != nil {
			return err
		}
		var bound time.Duration
		select {
		case t := <-scheduled:
			bound = t.Sub(created)
		case <-time.After(time.Duration(r.opts.PreemptWait) * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
		victims := len(r.deleted()) - gone
		res.Bound, res.Victims, res.Fewest = append(res.Bound, bound), append(res.Victims, victims), append(res.Fewest, fewest)
		if bound == 0 {
			res.Pending = append(res.Pending, r.why(ctx, name))
			break
		}
	}
	if r.sched.metrics == nil {
		return nil
	}
	page, err := r.sched.metrics(ctx)
	if err != nil {
		return err
	}
	return scanSamples(page, func(name string, labels map[string]string, v float64) {
		if labels["result"] != "Success" {
			return
		}
		switch name {
		case "scheduler_preemption_evaluation_duration_seconds_sum":
			res.Evaluating += time.Duration(v * float64(time.Second))
		case "scheduler_preemption_evaluation_duration_seconds_count":
			res.Evaluations += int(v)
		}
	})
}

// fill binds low-priority pods to a node, each with a claim allocated to
// its seat and reserved for it, as the scheduler leaves them: pair p is
// one 2x seat where layout[p], else two 1x seats.
func (r *preemptRound) fill(ctx context.Context, node string, layout []bool) error {
	type seat struct {
		class, gpus string
		held        []int
	}
	var seats []seat
	for p, whole := range layout {
		a, b := 2*p, 2*p+1
		if whole {
			seats = append(seats, seat{class: draresources.DeviceClassName("kyb.ai/gpu-2x-seat"), gpus: fmt.Sprintf("%d,%d", a, b), held: []int{a, b}})
			continue
		}
		for _, g := range []int{a, b} {
			seats = append(seats, seat{class: draresources.DeviceClassName("kyb.ai/gpu-1x-seat"), gpus: fmt.Sprint(g), held: []int{g}})
		}
	}
	sim := schedulertest.New(schedulertest.SchedulerFeatures())
	sim.AddNode(node, r.s.Resources(node), r.s.Driver)
	sim.AddClasses(r.s.Classes...)
	client := r.c.Client
	for k, s := range seats {
		name := fmt.Sprintf("%s-low-%d", node, k)
		claim := schedulertest.Claim(name, s.class, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+s.gpus+`"`))
		alloc, err := sim.Allocate(ctx, claim, node)
		if err != nil || alloc == nil {
			return fmt.Errorf("fill %s: seat on GPUs %s does not fit: %v", node, s.gpus, err)
		}
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.ns}}
		pod.Spec.NodeName = node
		pod.Spec.PriorityClassName = preemptLow
		pod.Spec.SchedulerName = r.sched.name
		pod.Spec.Containers = []v1.Container{{Name: "c", Image: "pause", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}
		pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}}
		pod, err = client.CoreV1().Pods(r.ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("fill %s: %w", node, err)
		}
		// The scheduler's finalizer: the resource-claim controller
		// deallocates only claims that carry it.
		obj := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.ns, Finalizers: []string{resourceapi.Finalizer}}, Spec: claim.Spec}
		if obj, err = client.ResourceV1().ResourceClaims(r.ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("fill %s: %w", node, err)
		}
		obj.Status.Allocation = alloc
		obj.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
		if _, err := client.ResourceV1().ResourceClaims(r.ns).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("fill %s: %w", node, err)
		}
		r.mu.Lock()
		if r.gpus[node] == nil {
			r.gpus[node] = map[string][]int{}
		}
		r.gpus[node][name] = s.held
		r.mu.Unlock()
	}
	return nil
}

func (r *preemptRound) createPreemptor(ctx context.Context, name string) error {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.ns}}
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: draresources.DeviceClassName("kyb.ai/gpu-4x-seat")}}}
	if _, err := r.c.Client.ResourceV1().ResourceClaims(r.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create claim %s: %w", name, err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.ns}}
	pod.Spec.SchedulerName = r.sched.name
	pod.Spec.PriorityClassName = preemptHigh
	pod.Spec.Containers = []v1.Container{{Name: "c", Image: "pause", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}}
	if _, err := r.c.Client.CoreV1().Pods(r.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	return nil
}

// fewest is the fewest low-priority pods whose eviction frees a four-GPU
// group on some node: a group with a pod of the high priority on it (a
// preemptor bound there) cannot be freed.
func (r *preemptRound) fewest() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	best := -1
	for node, pods := range r.gpus {
		for _, group := range [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}} {
			n := 0
			for name, held := range pods {
				if slices.Contains(r.gone, name) {
					continue
				}
				if slices.ContainsFunc(held, func(g int) bool { return slices.Contains(group, g) }) {
					n++
				}
			}
			if r.taken(node, group) {
				continue
			}
			if best < 0 || n < best {
				best = n
			}
		}
	}
	return best
}

// taken reports whether a preemptor holds the group: only preemption
// deletes pods here, and a preemptor is bound on the group it freed, so a
// group whose low-priority pods are all gone is a preemptor's.
func (r *preemptRound) taken(node string, group []int) bool {
	held := false
	for name, gpus := range r.gpus[node] {
		if slices.ContainsFunc(gpus, func(g int) bool { return slices.Contains(group, g) }) {
			if !slices.Contains(r.gone, name) {
				return false
			}
			held = true
		}
	}
	return held
}

func (r *preemptRound) deleted() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.gone)
}

// standInKubelet confirms the deletion of the round's pods, as a node's
// kubelet does once their containers stop, and notes which are gone.
func (r *preemptRound) standInKubelet(client kubernetes.Interface) (func(), error) {
	inf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(r.ns))
	pods := inf.Core().V1().Pods().Informer()
	confirm := func(obj any) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.DeletionTimestamp == nil {
			return
		}
		err := client.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		_ = err // gone already, or replaced: nothing to confirm
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { confirm(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*v1.Pod); ok && strings.Contains(pod.Name, "-low-") {
				r.mu.Lock()
				r.gone = append(r.gone, pod.Name)
				r.mu.Unlock()
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("watch the pods of %s: %w", r.ns, err)
	}
	stop := make(chan struct{})
	inf.Start(stop)
	inf.WaitForCacheSync(stop)
	return func() { close(stop); inf.Shutdown() }, nil
}

// Table summarises the study.
func (st *KybPreemptStudy) Table() *Table {
	t := &Table{
		Title: fmt.Sprintf("Preemption for a 4x seat on %d nodes full of low-priority seats: stock kube-scheduler against kyb-scheduler (%d rounds)",
			st.Options.PreemptNodes, st.Options.Rounds),
		Header: []string{"scheduler", "high-priority 4x pods", "created to bound (each)", "median", "victims (each)", "fewest possible (each)",
			"pods bound with more than the fewest", "preemptions evaluated, mean time"},
	}
	for _, r := range st.Results {
		var times, victims, fewest []string
		var bound []time.Duration
		more := 0
		for i := range r.Bound {
			if r.Bound[i] == 0 {
				times = append(times, fmt.Sprintf("not within %d s", st.Options.PreemptWait))
			} else {
				times = append(times, Dur(r.Bound[i]))
				bound = append(bound, r.Bound[i])
				if r.Victims[i] > r.Fewest[i] {
					more++
				}
			}
			victims = append(victims, fmt.Sprint(r.Victims[i]))
			fewest = append(fewest, fmt.Sprint(r.Fewest[i]))
		}
		med, over := "-", "-"
		if len(bound) > 0 {
			med = Dur(MedianDuration(bound))
			over = fmt.Sprintf("%d of %d", more, len(bound))
		}
		eval := "-"
		if r.Evaluations > 0 {
			eval = fmt.Sprintf("%d, %s", r.Evaluations, Dur(r.Evaluating/time.Duration(r.Evaluations)))
		}
		t.Rows = append(t.Rows, []string{r.Scheduler, fmt.Sprint(len(r.Bound)), strings.Join(times, ", "), med,
			strings.Join(victims, ", "), strings.Join(fewest, ", "), over, eval})
	}
	for _, r := range st.Results {
		for _, p := range r.Pending {
			t.Notes = append(t.Notes, fmt.Sprintf("%s: a pod left pending: %s", r.Scheduler, p))
		}
	}
	t.Notes = append(t.Notes, fmt.Sprintf("Each simulated %s node publishes one seat per group of 1, 2 and 4 GPUs; each GPU pair is held by one "+
		"low-priority 2x seat (chance %.2f) or two 1x seats, so a four-GPU group is freed by evicting 2 to 4 pods. High-priority pods, each "+
		"with a claim for one 4x seat, are created one after the other, each once the last is bound. Victims are the low-priority pods "+
		"deleted meanwhile; the fewest possible is the fewest low-priority pods on one four-GPU group of any node then. The evicted pods' "+
		"deletion is confirmed at once (no kubelet runs; containers would take their grace period), and the resource-claim controller "+
		"releases their claims. Stock kube-scheduler runs one pod, which stays pending: its preemption frees no device. "+
		"The evaluations are the scheduler's own (kube-scheduler's preemption metric, summed over the rounds): the dry run over every node "+
		"that nominated one; the rest of the time to binding is the eviction, the claims' release and the pod's backoff before it is tried again.",
		st.Options.Preset, PreemptPair2x))
	return t
}

// watchBound sends the time each pod of ns whose name has prefix is first
// seen bound, for up to pods pods, until stop.
func watchBound(client kubernetes.Interface, ns, prefix string, pods int) (<-chan time.Time, func(), error) {
	bound := make(chan time.Time, pods)
	seen := sync.Map{}
	note := func(obj any) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.Spec.NodeName == "" || !strings.HasPrefix(pod.Name, prefix) {
			return
		}
		if _, dup := seen.LoadOrStore(pod.UID, true); !dup {
			bound <- time.Now()
		}
	}
	inf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	if _, err := inf.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: note, UpdateFunc: func(_, obj any) { note(obj) },
	}); err != nil {
		return nil, nil, fmt.Errorf("watch the pods of %s: %w", ns, err)
	}
	stop := make(chan struct{})
	inf.Start(stop)
	inf.WaitForCacheSync(stop)
	return bound, func() { close(stop); inf.Shutdown() }, nil
}

// why is a pod's PodScheduled condition, for a pod left pending.
func (r *preemptRound) why(ctx context.Context, name string) string {
	pod, err := r.c.Client.CoreV1().Pods(r.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	terminating, stale := 0, 0
	if pods, err := r.c.Client.CoreV1().Pods(r.ns).List(ctx, metav1.ListOptions{}); err == nil {
		live := map[string]bool{}
		for _, p := range pods.Items {
			live[p.Name] = true
			if p.DeletionTimestamp != nil {
				terminating++
			}
		}
		if claims, err := r.c.Client.ResourceV1().ResourceClaims(r.ns).List(ctx, metav1.ListOptions{}); err == nil {
			for _, c := range claims.Items {
				for _, ref := range c.Status.ReservedFor {
					if !live[ref.Name] && c.Status.Allocation != nil {
						stale++
					}
				}
			}
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled {
			return fmt.Sprintf("%s: %s (nominated node %q; %d pods terminating, %d claims still allocated to pods gone)",
				c.Reason, c.Message, pod.Status.NominatedNodeName, terminating, stale)
		}
	}
	return "no PodScheduled condition"
}
