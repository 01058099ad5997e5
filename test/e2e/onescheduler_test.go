package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/kubernetes/pkg/controller/replicaset"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// The chart's admission policies of values scheduler.gpuPods (on with
// scheduler.enabled) give kyb-scheduler every pod that may be allocated
// devices of DRA, so that the default scheduler running beside it never
// allocates a seat that kyb-scheduler allocates too. Proven here on the
// real API server, with the chart as rendered, the default scheduler and
// the real kyb-scheduler both running.

// defaultScheduler is what the API server makes an unset schedulerName.
const defaultScheduler = "default-scheduler"

// TestChartGivesEveryGPUPodToKybScheduler runs a dgx-h100 node (8 GPUs:
// eight 1x, four 2x and two 4x groups, one seat each) under both
// schedulers, with the chart installed with scheduler.enabled.
func TestChartGivesEveryGPUPodToKybScheduler(t *testing.T) {
	c := harness.Start(t, harness.Options{
		KybScheduler: &harness.KybSchedulerOptions{},
		Nodes:        []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100"}},
	})
	const ns = "kyb-system"
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The whole chart: its DeviceClasses (with their extended resources)
	// too. No controller runs its DaemonSet or Deployment here; the
	// harness runs the plugin and kyb-scheduler.
	if _, err := c.Apply(helmTemplate(t, "kyb", ns, "--set", "scheduler.enabled=true"), harness.ApplyOptions{Namespace: ns}); err != nil {
		t.Fatalf("install the chart: %v", err)
	}
	waitForGPUPodPolicies(t, c)
	createTemplate(t, c, "seat-1x", class1x)
	createTemplate(t, c, "seat-2x", class2x)
	for _, gpus := range []string{"0,1", "2,3", "4,5"} {
		createTemplate(t, c, "seat-2x-gpus"+strings.ReplaceAll(gpus, ",", ""), class2x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+gpus+`"`))
	}
	sched := c.KybScheduler
	defer func() {
		if t.Failed() {
			t.Logf("kyb-scheduler's log, last lines:\n%s", sched.Tail(60))
		}
	}()

	// GPUs 0 to 5 held; 6 and 7 free: the seats of 1x groups 6 and 7, or
	// that of the pair 6-7. Eleven pods ask for them at once, through
	// both routes: no schedulerName and kyb-scheduler's, claims from
	// templates, the profiles' extended resources and a DeviceClass's
	// implicit one. Every pod goes to kyb-scheduler, which places what
	// fits and no more: each GPU is allocated once, and the node
	// prepares every claim it is given.
	t.Run("pods of both routes at once for the last free seats", func(t *testing.T) {
		defer clearPods(t, c)
		runningOn(t, c, "held-01", seatFrom("seat-2x-gpus01"))
		runningOn(t, c, "held-23", seatFrom("seat-2x-gpus23"))
		runningOn(t, c, "held-45", seatFrom("seat-2x-gpus45"))
		unset := func(p *v1.Pod) { p.Spec.SchedulerName = "" }
		burst := map[string][]podOpt{
			"claim-1x-unset-0":  {seatFrom("seat-1x"), unset},
			"claim-1x-unset-1":  {seatFrom("seat-1x"), unset},
			"claim-1x-kyb-0":    {seatFrom("seat-1x")},
			"claim-1x-kyb-1":    {seatFrom("seat-1x")},
			"claim-2x-unset":    {seatFrom("seat-2x"), unset},
			"claim-2x-kyb":      {seatFrom("seat-2x")},
			"extended-1x-unset": {extended("kyb.ai/gpu-1x-seat", 1), unset},
			"extended-1x-kyb":   {extended("kyb.ai/gpu-1x-seat", 1)},
			"extended-2x-unset": {extended("kyb.ai/gpu-2x-seat", 1), unset},
			"implicit-1x-unset": {extended("deviceclass.resource.kubernetes.io/"+class1x, 1), unset},
			"implicit-1x-kyb":   {extended("deviceclass.resource.kubernetes.io/"+class1x, 1)},
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, len(burst))
		for name, opts := range burst {
			wg.Go(func() {
				<-start
				errs <- createKybPod(c, name, opts...)
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		names := slices.Sorted(maps.Keys(burst))
		bound := settle(t, c, names)
		logPods(t, c, "GPUs 0-5 held, then eleven pods at once for GPUs 6 and 7")

		for _, name := range names {
			pod, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.SchedulerName != kybScheduler {
				t.Errorf("pod %s names scheduler %q, want %s", name, pod.Spec.SchedulerName, kybScheduler)
			}
		}
		if len(bound) == 0 {
			t.Fatal("no pod of the burst was placed on the two free GPUs")
		}
		for _, name := range bound {
			c.WaitForPodRunning(t, "default", name, timeout)
			if by := scheduledBy(t, c, name); by != kybScheduler {
				t.Errorf("pod %s was scheduled by %q, want %s", name, by, kybScheduler)
			}
		}
		holders := gpuHolders(t, c, "node-a")
		t.Logf("GPUs of node-a and the claims allocated them: %v", holders)
		for gpu := range 8 {
			if got := holders[fmt.Sprint(gpu)]; len(got) != 1 {
				t.Errorf("GPU %d is allocated to %v, want exactly one claim", gpu, got)
			}
		}
		checkNoPrepareRefused(t, c, append(names, "held-01", "held-23", "held-45"))
	})

	t.Run("pods without GPUs keep their scheduler", func(t *testing.T) {
		defer clearPods(t, c)
		cpu := func(p *v1.Pod) {
			p.Spec.SchedulerName = ""
			p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}
		}
		plain := runningOn(t, c, "plain", cpu)
		if plain != "node-a" {
			t.Errorf("pod plain ran on %q", plain)
		}
		pod, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, "plain", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Spec.SchedulerName != defaultScheduler {
			t.Errorf("pod plain names scheduler %q, want %s", pod.Spec.SchedulerName, defaultScheduler)
		}
		if by := scheduledBy(t, c, "plain"); by != defaultScheduler {
			t.Errorf("pod plain was scheduled by %q, want %s", by, defaultScheduler)
		}
		// A pod without GPUs may name any scheduler, one that runs or not.
		if err := createKybPod(c, "third", func(p *v1.Pod) { p.Spec.SchedulerName = "batch-scheduler" }); err != nil {
			t.Errorf("a pod without GPUs naming batch-scheduler: %v", err)
		}
	})

	// A pod using GPUs that names a third scheduler would let that one
	// allocate seats too: refused, saying why.
	t.Run("another scheduler is refused", func(t *testing.T) {
		defer clearPods(t, c)
		third := func(p *v1.Pod) { p.Spec.SchedulerName = "batch-scheduler" }
		for name, opts := range map[string][]podOpt{
			"third-claim":    {seatFrom("seat-1x"), third},
			"third-extended": {extended("kyb.ai/gpu-1x-seat", 1), third},
		} {
			err := createKybPod(c, name, opts...)
			if err == nil || !strings.Contains(err.Error(), `may be scheduled only by kyb-scheduler, not by "batch-scheduler"`) {
				t.Errorf("pod %s naming batch-scheduler: %v, want it refused", name, err)
				continue
			}
			t.Logf("pod %s refused: %v", name, err)
		}
	})

	// No scheduler takes a GPU pod while kyb-scheduler is down: it waits,
	// Pending, and the default scheduler leaves it alone; kyb-scheduler
	// places it once it runs again.
	t.Run("while kyb-scheduler is down, GPU pods wait", func(t *testing.T) {
		defer clearPods(t, c)
		sched.Stop()
		if err := createKybPod(c, "waits", seatFrom("seat-1x"), func(p *v1.Pod) { p.Spec.SchedulerName = "" }); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			pod, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, "waits", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.NodeName != "" || len(pod.Status.Conditions) > 0 {
				t.Fatalf("pod waits was taken up while kyb-scheduler was down: node %q, conditions %+v", pod.Spec.NodeName, pod.Status.Conditions)
			}
			time.Sleep(200 * time.Millisecond)
		}
		sched = c.StartKybScheduler(harness.KybSchedulerOptions{Name: "kyb-scheduler-again"})
		c.WaitForPodRunning(t, "default", "waits", timeout)
		if by := scheduledBy(t, c, "waits"); by != kybScheduler {
			t.Errorf("pod waits was scheduled by %q, want %s", by, kybScheduler)
		}
	})

	// The policy applies to pods as they are created, by whomever: the
	// ReplicaSet controller's pod goes to kyb-scheduler, while the
	// ReplicaSet's template keeps the scheduler it names.
	t.Run("a controller's pods", func(t *testing.T) {
		startReplicaSetController(t, c)
		rs := &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: "default"},
			Spec: appsv1.ReplicaSetSpec{
				Replicas: ptr.To[int32](2),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "workers"}},
				Template: v1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "workers"}},
					Spec: v1.PodSpec{
						ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("seat-1x")}},
						Containers: []v1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10",
							Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
					},
				},
			},
		}
		created, err := c.Client.AppsV1().ReplicaSets("default").Create(c.Ctx, rs, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := c.Client.AppsV1().ReplicaSets("default").Delete(c.Ctx, "workers", metav1.DeleteOptions{}); err != nil {
				t.Error(err)
			}
			clearPods(t, c)
		}()
		if got := created.Spec.Template.Spec.SchedulerName; got != defaultScheduler {
			t.Errorf("the ReplicaSet's template names %q, want %s (the policy mutates pods, not templates)", got, defaultScheduler)
		}
		var pods []v1.Pod
		waitUntil(t, c, "the ReplicaSet's two pods running", func(ctx context.Context) bool {
			l, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=workers"})
			if err != nil || len(l.Items) != 2 {
				return false
			}
			pods = l.Items
			for _, p := range l.Items {
				if p.Status.Phase != v1.PodRunning {
					return false
				}
			}
			return true
		})
		logPods(t, c, "a ReplicaSet of two 1x seat pods whose template names no scheduler")
		for _, p := range pods {
			if p.Spec.SchedulerName != kybScheduler {
				t.Errorf("the ReplicaSet's pod %s names %q, want %s", p.Name, p.Spec.SchedulerName, kybScheduler)
			}
			if by := scheduledBy(t, c, p.Name); by != kybScheduler {
				t.Errorf("the ReplicaSet's pod %s was scheduled by %q, want %s", p.Name, by, kybScheduler)
			}
		}
	})
}

// waitForGPUPodPolicies waits until the API server enforces the chart's
// policies, which it loads some time after they are created: a pod with
// a claim that names no scheduler gets kyb-scheduler, and one that names
// a third scheduler is refused (server-side dry runs).
func waitForGPUPodPolicies(t *testing.T, c *harness.Cluster) {
	t.Helper()
	probe := func(scheduler string) (*v1.Pod, error) {
		tmpl := "probe"
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"},
			Spec: v1.PodSpec{
				SchedulerName:  scheduler,
				ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}},
				Containers: []v1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10",
					Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
			},
		}
		return c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	}
	// The API server loads each policy on its own: the validating one
	// may refuse an unnamed pod before the mutating one names
	// kyb-scheduler for it. Until both hold, a refusal is a wait.
	var mutated string
	var unnamedErr, refused error
	err := wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		pod, err := probe("")
		unnamedErr = err
		if err != nil {
			return false, nil
		}
		mutated = pod.Spec.SchedulerName
		_, refused = probe("batch-scheduler")
		return mutated == kybScheduler && refused != nil, nil
	})
	if err != nil {
		t.Fatalf("the chart's policies are not enforced after %v: a pod with a claim that names no scheduler gets %q (want %s), last error %v; one naming batch-scheduler: %v (want refused): %v",
			timeout, mutated, kybScheduler, unnamedErr, refused, err)
	}
}

// createKybPod creates a pod as kybPod does and returns the API server's
// answer.
func createKybPod(c *harness.Cluster, name string, opts ...podOpt) error {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{
			SchedulerName: kybScheduler,
			Containers:    []v1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	for _, o := range opts {
		o(pod)
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	return nil
}

// settle waits until each pod is either running or reported
// unschedulable, and returns those bound to a node.
func settle(t *testing.T, c *harness.Cluster, names []string) []string {
	t.Helper()
	var bound []string
	err := wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		bound = nil
		for _, name := range names {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Spec.NodeName != "" {
				if p.Status.Phase != v1.PodRunning {
					return false, nil
				}
				bound = append(bound, name)
				continue
			}
			unschedulable := slices.ContainsFunc(p.Status.Conditions, func(cond v1.PodCondition) bool {
				return cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable
			})
			if !unschedulable {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		var states []string
		for _, name := range names {
			states = append(states, name+": "+c.DescribePod("default", name))
		}
		t.Fatalf("the pods did not settle, each running or unschedulable, in %v:\n%s", timeout, strings.Join(states, "\n"))
	}
	return bound
}

// scheduledBy is the scheduler that reported a pod Scheduled: the
// reporting controller of its event, the profile's scheduler name.
func scheduledBy(t *testing.T, c *harness.Cluster, pod string) string {
	t.Helper()
	var by []string
	waitUntil(t, c, "pod "+pod+"'s Scheduled event", func(ctx context.Context) bool {
		l, err := c.Client.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		by = nil
		for _, e := range l.Items {
			if e.Reason == "Scheduled" && e.Regarding.Kind == "Pod" && e.Regarding.Name == pod {
				by = append(by, e.ReportingController)
			}
		}
		return len(by) > 0
	})
	if len(by) != 1 {
		t.Errorf("pod %s has %d Scheduled events, by %v", pod, len(by), by)
	}
	return by[0]
}

// gpuHolders maps each GPU of a node to the claims whose allocation holds
// it, read from the claims' allocations and the GPUs each allocated device
// spans in the node's ResourceSlices.
func gpuHolders(t *testing.T, c *harness.Cluster, node string) map[string][]string {
	t.Helper()
	published, err := c.Client.ResourceV1().ResourceSlices().List(c.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	gpus := map[string][]string{}
	for _, s := range published.Items {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["gpuIndices"]; ok && a.StringValue != nil {
				gpus[s.Spec.Pool.Name+"/"+d.Name] = strings.Split(*a.StringValue, ",")
			}
		}
	}
	claims, err := c.Client.ResourceV1().ResourceClaims("default").List(c.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string][]string{}
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.Driver != "gpu.kyb.ai" {
				continue
			}
			indices, ok := gpus[r.Pool+"/"+r.Device]
			if !ok {
				t.Fatalf("claim %s holds %s/%s, which node %s's slices do not publish with its GPUs", cl.Name, r.Pool, r.Device, node)
			}
			for _, g := range indices {
				holders[g] = append(holders[g], cl.Name+"("+r.Device+")")
			}
		}
	}
	return holders
}

// checkNoPrepareRefused checks that the node prepared every claim it was
// given: no pod's prepare failed, and no claim has a PrepareFailed event.
func checkNoPrepareRefused(t *testing.T, c *harness.Cluster, pods []string) {
	t.Helper()
	for _, name := range pods {
		pod, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			if err := n.PrepareFailure(pod.UID); err != nil {
				t.Errorf("node %s failed pod %s's prepare: %v", n.Name, name, err)
			}
		}
	}
	events, err := c.Client.EventsV1().Events("default").List(c.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Reason == "PrepareFailed" || e.Reason == "FailedPrepareDynamicResources" {
			t.Errorf("%s %s: %s %s", e.Regarding.Kind, e.Regarding.Name, e.Reason, e.Note)
		}
	}
}

// startReplicaSetController runs kube-controller-manager's ReplicaSet
// controller in this process until the test ends.
func startReplicaSetController(t *testing.T, c *harness.Cluster) {
	t.Helper()
	ctx, cancel := context.WithCancel(c.Ctx)
	inf := informers.NewSharedInformerFactory(c.Client, 0)
	rsc := replicaset.NewReplicaSetController(ctx, inf.Apps().V1().ReplicaSets(), inf.Core().V1().Pods(), c.Client, replicaset.BurstReplicas)
	inf.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		rsc.Run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		inf.Shutdown()
	})
}
