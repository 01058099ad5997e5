package placement

// The policies of this file place through a real scheduler: each request
// becomes a ResourceClaim of its size's DeviceClass and a pod that uses
// it, on a control plane whose nodes publish the DRA rows' slices, and
// the scheduler decides. The simulation's clock is its own (events are
// processed one by one), so the scheduler may take as long as it takes.
//
// What the scheduler has not seen yet. Kube-scheduler decides from its
// informers' caches, which the API server feeds asynchronously. A
// release the cache has not seen yet would make the next request find
// too little room: a reject the study would blame on the policy. Two
// guards:
//
//   - Before each placement that follows a release, the study waits until
//     its own informers have seen the deleted pods and claims go (the API
//     server has then sent the deletions to every watcher), then Settle
//     more for the scheduler's event handlers.
//   - A reject while the study's mirror has a whole free topology group
//     of the request's size on some node is checked again: the scheduler
//     moves a pod it found unschedulable back to its queue on the events
//     (a claim deleted) that may make it fit, so a reject caused by a
//     stale cache binds the pod within Recheck (its first backoff is 1 s).
//     Such a pod is kept, as placed on arrival, and counted as a stale
//     reject; a pod still unschedulable after Recheck is rejected and
//     counted as rejected with room (Result.RejectedWithRoom): a
//     disagreement between the scheduler and the mirror, which every row
//     should show as 0.
//
// Releases delete the pod at once (no grace period: no kubelet runs) and
// the claim with its finalizer taken off, as the resource-claim
// controller would once the pod is gone: what the scheduler then sees is
// what it sees when a job ends, in one step instead of three.

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// SchedPolicies place through a real scheduler: the harness's in-process
// kube-scheduler, and the kyb-scheduler binary under each of its
// policies (chosen per pod by annotation); the -defrag rows through a
// second kyb-scheduler, with --defragmentation=on (defrag.go).
var SchedPolicies = []string{"sched-stock", "kyb-pack", "kyb-topology", "kyb-spread", "kyb-pack-defrag", "kyb-topology-defrag"}

// placementAnnotation chooses kyb-scheduler's policy for a pod
// (docs/kyb-scheduler.md).
const placementAnnotation = "gpu.kyb.ai/placement"

// unschedulableNoFit is the reason the DRA plugin's Filter gives a node
// where the pod's claims cannot be allocated. A pod reported
// unschedulable for another reason (its claim not in the scheduler's
// cache yet) is not a verdict: the scheduler tries again once the claim
// arrives.
const unschedulableNoFit = "cannot allocate all claims"

type schedPolicy struct {
	name       string
	cp         *controlPlane
	nodes      map[string]*Node
	classes    map[int]string
	scheduler  string
	annotation string
	ns         string
	pods       cache.Indexer
	claims     cache.Indexer
	// changed is signalled on every event of the namespace's pods.
	changed chan struct{}
	stop    chan struct{}
	// gone are the pods and claims deleted since the last placement.
	gone []string
	// staleRejects counts rejects the scheduler took back on its retry.
	staleRejects int
	// defrag, for the rows whose scheduler moves pods, follows the moves
	// (defrag.go).
	defrag *moving
}

// newSched returns the named policy over nodes, placing through cp in a
// namespace of its own.
func newSched(ctx context.Context, name string, cp *controlPlane, nodes []*Node) (*schedPolicy, error) {
	p := &schedPolicy{name: name, cp: cp, nodes: map[string]*Node{}, classes: map[int]string{}, ns: "placement-" + name,
		changed: make(chan struct{}, 1), stop: make(chan struct{})}
	switch name {
	case "sched-stock":
		p.scheduler = v1.DefaultSchedulerName
	case "kyb-pack", "kyb-topology", "kyb-spread":
		p.scheduler = "kyb-scheduler"
		p.annotation = strings.TrimPrefix(name, "kyb-")
	case "kyb-pack-defrag", "kyb-topology-defrag":
		p.scheduler = defragScheduler
		p.annotation = strings.TrimSuffix(strings.TrimPrefix(name, "kyb-"), "-defrag")
		p.defrag = &moving{running: map[string]*runningPod{}}
	default:
		return nil, fmt.Errorf("unknown policy %q", name)
	}
	for _, n := range nodes {
		p.nodes[n.Name] = n
		for _, prof := range n.plans[v1alpha1.PolicyPack].Profiles {
			p.classes[prof.Size] = draresources.DeviceClassName(prof.Resource)
		}
	}
	client := cp.c.Client
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.ns}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", p.ns, err)
	}
	inf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(p.ns))
	podInf := inf.Core().V1().Pods().Informer()
	signal := func() {
		select {
		case p.changed <- struct{}{}:
		default:
		}
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal() },
		UpdateFunc: func(any, any) { signal() },
		DeleteFunc: func(any) { signal() },
	}); err != nil {
		return nil, err
	}
	claimInf := inf.Resource().V1().ResourceClaims().Informer()
	if _, err := claimInf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { signal() }}); err != nil {
		return nil, err
	}
	p.pods, p.claims = podInf.GetIndexer(), claimInf.GetIndexer()
	inf.Start(p.stop)
	for typ, ok := range inf.WaitForCacheSync(p.stop) {
		if !ok {
			close(p.stop)
			return nil, fmt.Errorf("%s: informer of %v did not sync", name, typ)
		}
	}
	return p, nil
}

func (p *schedPolicy) Name() string      { return p.name }
func (p *schedPolicy) Batch() float64    { return 0 }
func (p *schedPolicy) StaleRejects() int { return p.staleRejects }

// Sync waits until the scheduler has most likely seen every release since
// the last placement (see the top of the file). Simulate calls it before
// it times a placement.
func (p *schedPolicy) Sync(ctx context.Context) error {
	if len(p.gone) == 0 {
		return nil
	}
	err := p.await(ctx, func() (bool, error) {
		for _, key := range p.gone {
			_, inPods, _ := p.pods.GetByKey(key)
			_, inClaims, _ := p.claims.GetByKey(key)
			if inPods || inClaims {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %d deleted pods and claims to go: %w", len(p.gone), err)
	}
	p.gone = p.gone[:0]
	select {
	case <-time.After(p.cp.env.Settle):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// await checks done on every event of the namespace's pods or deleted
// claims, until it says so or the timeout passes.
func (p *schedPolicy) await(ctx context.Context, done func() (bool, error)) error {
	timeout := time.After(p.cp.env.Timeout)
	for {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		select {
		case <-p.changed:
		// Claims' other events do not signal; look again now and then.
		case <-time.After(50 * time.Millisecond):
		case <-timeout:
			return fmt.Errorf("nothing after %v", p.cp.env.Timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *schedPolicy) Place(ctx context.Context, r Request) (*Placement, error) {
	name := fmt.Sprintf("r%d", r.ID)
	if err := p.create(ctx, name, r.Size); err != nil {
		return nil, err
	}
	if p.defrag != nil {
		return p.placeMoving(ctx, r, name)
	}
	key := p.ns + "/" + name

	node, err := p.verdict(ctx, key, p.cp.env.Timeout, false)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", key, err)
	}
	if node == "" && p.roomFor(r.Size) {
		// The mirror has room: give the scheduler its retry.
		if node, err = p.verdict(ctx, key, p.cp.env.Recheck, true); err != nil {
			return nil, fmt.Errorf("pod %s: %w", key, err)
		}
		logger := klog.FromContext(ctx)
		if node != "" {
			p.staleRejects++
			logger.V(2).Info("Placed on the scheduler's retry", "pod", key, "node", node)
		} else {
			logger.Info("Rejected while a group of the size was free", "pod", key, "size", r.Size, "message", p.message(key))
		}
	}
	if node == "" {
		return nil, p.remove(ctx, name)
	}
	return p.placed(ctx, r, name, node)
}

// create makes the claim and the pod of a request of size GPUs.
func (p *schedPolicy) create(ctx context.Context, name string, size int) error {
	class, ok := p.classes[size]
	if !ok {
		return fmt.Errorf("no profile of %d GPUs", size)
	}
	client := p.cp.c.Client
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.ns}}
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}
	if _, err := client.ResourceV1().ResourceClaims(p.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create claim %s/%s: %w", p.ns, name, err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.ns}}
	if p.annotation != "" {
		pod.Annotations = map[string]string{placementAnnotation: p.annotation}
	}
	pod.Spec.SchedulerName = p.scheduler
	// No CPU or memory requests: the scheduler's choice among the nodes
	// rests on the GPUs (stock kube-scheduler's LeastAllocated still
	// counts each pod at its defaults, 100m and 200Mi).
	pod.Spec.Containers = []v1.Container{{Name: "c", Image: "pause", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}}
	if p.defrag != nil {
		movable(pod)
	}
	if _, err := client.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s/%s: %w", p.ns, name, err)
	}
	return nil
}

// verdict waits until the pod is bound (it returns the node) or reported
// unschedulable because no node can allocate its claim (it returns "").
// With recheck, a pod already reported so is given until the timeout to
// be bound after all; without, the timeout is an error.
func (p *schedPolicy) verdict(ctx context.Context, key string, timeout time.Duration, recheck bool) (string, error) {
	deadline := time.After(timeout)
	for {
		unschedulable := false
		if obj, ok, _ := p.pods.GetByKey(key); ok {
			pod := obj.(*v1.Pod)
			if pod.Spec.NodeName != "" {
				return pod.Spec.NodeName, nil
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable &&
					strings.Contains(c.Message, unschedulableNoFit) {
					unschedulable = true
				}
			}
		}
		if unschedulable && !recheck {
			return "", nil
		}
		select {
		case <-p.changed:
		case <-deadline:
			if recheck {
				return "", nil
			}
			return "", fmt.Errorf("neither bound nor unschedulable for want of devices after %v", timeout)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// message is what the scheduler last said of the pod.
func (p *schedPolicy) message(key string) string {
	if obj, ok, _ := p.pods.GetByKey(key); ok {
		for _, c := range obj.(*v1.Pod).Status.Conditions {
			if c.Type == v1.PodScheduled {
				return c.Message
			}
		}
	}
	return ""
}

// roomFor says whether the mirror has, on some node, a whole free
// topology group of size k: what the allocator would give the request.
func (p *schedPolicy) roomFor(k int) bool {
	for _, n := range p.nodes {
		if len(n.freeGroups(k)) > 0 {
			return true
		}
	}
	return false
}

// placed reads the claim's allocation: the device the scheduler chose is
// a group of the node's plan.
func (p *schedPolicy) placed(ctx context.Context, r Request, name, nodeName string) (*Placement, error) {
	claim, err := p.cp.c.Client.ResourceV1().ResourceClaims(p.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s of a bound pod: %w", p.ns, name, err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		return nil, fmt.Errorf("claim %s/%s of a pod bound to %s: allocation %+v, want one device", p.ns, name, nodeName, claim.Status.Allocation)
	}
	res := claim.Status.Allocation.Devices.Results[0]
	n := p.nodes[nodeName]
	if n == nil || res.Driver != driver.Name || res.Pool != nodeName {
		return nil, fmt.Errorf("claim %s/%s: pod bound to %s, device %s/%s/%s", p.ns, name, nodeName, res.Driver, res.Pool, res.Device)
	}
	g := n.plans[v1alpha1.PolicyPack].GroupByDevice(res.Device)
	if g == nil {
		return nil, fmt.Errorf("node %s: the scheduler chose %s, which the plan does not know", nodeName, res.Device)
	}
	gpus := append([]int(nil), g.GPUs...)
	pl := &Placement{Node: n, GPUs: gpus, Aligned: len(gpus) == r.Size && aligned(n, gpus), release: func() error { return p.remove(ctx, name) }}
	if p.defrag != nil {
		p.defrag.running[name] = &runningPod{r: r, pl: pl}
	}
	return pl, nil
}

// remove deletes the pod and its claim, the claim's finalizer first (the
// scheduler puts it on the claims it allocates), and notes both for Sync.
func (p *schedPolicy) remove(ctx context.Context, name string) error {
	client := p.cp.c.Client
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	if err := client.CoreV1().Pods(p.ns).Delete(ctx, name, now); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s/%s: %w", p.ns, name, err)
	}
	if _, err := client.ResourceV1().ResourceClaims(p.ns).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("claim %s/%s: drop finalizers: %w", p.ns, name, err)
	}
	if err := client.ResourceV1().ResourceClaims(p.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete claim %s/%s: %w", p.ns, name, err)
	}
	p.gone = append(p.gone, p.ns+"/"+name)
	if p.defrag != nil {
		delete(p.defrag.running, name)
	}
	return nil
}

// Close removes what the row left running, so that the next row starts
// on idle nodes, and stops the informers.
func (p *schedPolicy) Close(ctx context.Context) error {
	defer close(p.stop)
	for _, key := range p.pods.ListKeys() {
		_, name, _ := cache.SplitMetaNamespaceKey(key)
		if err := p.remove(ctx, name); err != nil {
			return err
		}
	}
	for _, key := range p.claims.ListKeys() {
		_, name, _ := cache.SplitMetaNamespaceKey(key)
		if err := p.remove(ctx, name); err != nil {
			return err
		}
	}
	return p.Sync(ctx)
}
