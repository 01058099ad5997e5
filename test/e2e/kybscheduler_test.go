package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// kybScheduler is the profile of kyb-scheduler's built-in configuration.
const kybScheduler = "kyb-scheduler"

// podOpt shapes a pod of the kyb-scheduler tests.
type podOpt func(*v1.Pod)

// seatFrom gives the pod a claim from a ResourceClaimTemplate.
func seatFrom(tmpl string) podOpt {
	return func(p *v1.Pod) {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: &tmpl})
		p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, v1.ResourceClaim{Name: "gpu"})
	}
}

// extended asks for an extended resource in the container's limits.
func extended(name v1.ResourceName, n int64) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{name: *resource.NewQuantity(n, resource.DecimalSI)}
	}
}

func placement(policy string) podOpt {
	return func(p *v1.Pod) { p.Annotations = map[string]string{"gpu.kyb.ai/placement": policy} }
}

func onNode(node string) podOpt {
	return func(p *v1.Pod) { p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node} }
}

func inGang(group string) podOpt {
	return func(p *v1.Pod) { p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: &group} }
}

// kybPod creates a pod that kyb-scheduler schedules (unless an option
// names another scheduler).
func kybPod(t *testing.T, c *harness.Cluster, name string, opts ...podOpt) {
	t.Helper()
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
		t.Fatalf("create pod %s: %v", name, err)
	}
}

// runningOn creates a pod and returns the node it runs on once running.
func runningOn(t *testing.T, c *harness.Cluster, name string, opts ...podOpt) string {
	t.Helper()
	kybPod(t, c, name, opts...)
	pod, _, _ := c.WaitForPodRunning(t, "default", name, timeout)
	return pod.Spec.NodeName
}

// clearPods deletes every pod of the namespace and waits until their
// claims are gone too, so that the next scenario starts on idle nodes.
func clearPods(t *testing.T, c *harness.Cluster) {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		c.DeletePod(t, "default", p.Name)
	}
	// The resource-claim controller deallocates the claims of pods that
	// are gone; deleting them is the garbage collector's, which does not
	// run here.
	if err := c.Client.ResourceV1().ResourceClaims("default").DeleteCollection(c.Ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, c, "every claim to go", func(ctx context.Context) bool {
		claims, err := c.Client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(claims.Items) == 0
	})
}

func logPods(t *testing.T, c *harness.Cluster, title string) {
	t.Helper()
	table, err := c.PodsWide("default")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: kubectl get pods -o wide\n%s", title, table)
}

// TestKybScheduler runs kyb-scheduler, the real binary with its built-in
// configuration (no --config: the kyb-scheduler profile, pack), beside the
// default scheduler, on three dgx-h100 nodes (8 one-GPU, 4 two-GPU and 2
// four-GPU groups each, one seat per group). The API server serves the
// Workload and PodGroup API for gangs.
func TestKybScheduler(t *testing.T) {
	c := harness.Start(t, harness.Options{
		FeatureGates:   map[string]bool{"GenericWorkload": true},
		APIServerFlags: []string{"--runtime-config=scheduling.k8s.io/v1beta1=true"},
		KybScheduler:   &harness.KybSchedulerOptions{},
		Nodes: []harness.NodeOptions{
			{Name: "node-a", Preset: "dgx-h100"},
			{Name: "node-b", Preset: "dgx-h100"},
			{Name: "node-c", Preset: "dgx-h100"},
		},
	})
	installClasses(t, c)
	createTemplate(t, c, "seat-1x", class1x)
	createTemplate(t, c, "seat-2x", class2x)
	createTemplate(t, c, "seat-4x", class4x)
	for _, gpu := range []string{"0", "2", "4"} {
		createTemplate(t, c, "seat-1x-gpu"+gpu, class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+gpu+`"`))
	}
	createTemplate(t, c, "seat-2x-gpu01", class2x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0,1"`))
	createTemplate(t, c, "seat-2x-gpu45", class2x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "4,5"`))
	defer func() {
		if t.Failed() {
			t.Logf("kyb-scheduler's log, last lines:\n%s", c.KybScheduler.Tail(60))
		}
	}()

	t.Run("pack fills one node before the next", func(t *testing.T) {
		defer clearPods(t, c)
		var nodes []string
		for i := range 10 {
			nodes = append(nodes, runningOn(t, c, fmt.Sprintf("pack-%d", i), seatFrom("seat-1x")))
		}
		logPods(t, c, "ten 1x seat pods created one after the other, kyb-scheduler (pack)")
		first, second := nodes[0], nodes[8]
		want := append(slices.Repeat([]string{first}, 8), second, second)
		if !slices.Equal(nodes, want) || first == second {
			t.Errorf("pods ran on %v, want eight on one node, then two on another", nodes)
		}
	})

	t.Run("spread", func(t *testing.T) {
		defer clearPods(t, c)
		nodes := map[string]bool{}
		for i := range 3 {
			nodes[runningOn(t, c, fmt.Sprintf("spread-%d", i), seatFrom("seat-1x"), placement("spread"))] = true
		}
		logPods(t, c, "three 1x seat pods annotated gpu.kyb.ai/placement: spread")
		if len(nodes) != 3 {
			t.Errorf("spread put three pods on %v, want three nodes", slices.Sorted(maps.Keys(nodes)))
		}
	})

	// node-a holds 1x seats on GPUs 0 and 2: its next 1x seat (GPU 1 or
	// 3) breaks no idle larger group. node-b holds 2x seats on GPUs 0-1
	// and 4-5: fuller, but a seat on any of its free GPUs breaks an idle
	// pair (2-3 or 6-7). node-c is idle: a seat there breaks a pair and a
	// four-GPU group. Pack takes a node in use, and among those the one
	// where the seat breaks no idle group; topology chooses by broken
	// groups alone: node-a for both.
	t.Run("topology keeps larger groups whole", func(t *testing.T) {
		defer clearPods(t, c)
		runningOn(t, c, "a-gpu0", seatFrom("seat-1x-gpu0"), onNode("node-a"))
		runningOn(t, c, "a-gpu2", seatFrom("seat-1x-gpu2"), onNode("node-a"))
		runningOn(t, c, "b-gpu01", seatFrom("seat-2x-gpu01"), onNode("node-b"))
		runningOn(t, c, "b-gpu45", seatFrom("seat-2x-gpu45"), onNode("node-b"))
		if got := runningOn(t, c, "packed", seatFrom("seat-1x"), placement("pack")); got != "node-a" {
			t.Errorf("pack chose %s, want node-a (in use, breaks no idle pair or four-GPU group)", got)
		}
		c.DeletePod(t, "default", "packed")
		if got := runningOn(t, c, "topology", seatFrom("seat-1x"), placement("topology")); got != "node-a" {
			t.Errorf("topology chose %s, want node-a (breaks no idle pair or four-GPU group)", got)
		}
		logPods(t, c, "topology after pack")
	})

	// node-a holds a 1x seat on GPU 2. The published order's first free
	// 1x group is GPU 0's, which breaks the idle pair 0-1; kyb-scheduler
	// hands its allocator the pod's device order and the seat goes to
	// GPU 3, whose pair and four-GPU group GPU 2 already broke. The
	// default scheduler, stock, takes GPU 0.
	t.Run("the group within the node", func(t *testing.T) {
		defer clearPods(t, c)
		runningOn(t, c, "a-gpu2", seatFrom("seat-1x-gpu2"), onNode("node-a"))
		device := func(name string) string {
			pod, _, _ := c.WaitForPodRunning(t, "default", name, timeout)
			got := c.Allocation("default", harness.PodClaim(pod, "gpu"))
			if len(got) != 1 {
				t.Fatalf("%s's claim holds %v, want one device", name, got)
			}
			return got[0]
		}
		runningOn(t, c, "ordered", seatFrom("seat-1x"), onNode("node-a"))
		if got := device("ordered"); got != "node-a/g3-1x" {
			t.Errorf("kyb-scheduler gave the seat %s, want node-a/g3-1x (beside the busy GPU 2)", got)
		}
		c.DeletePod(t, "default", "ordered")
		kybPod(t, c, "stock", seatFrom("seat-1x"), onNode("node-a"), func(p *v1.Pod) { p.Spec.SchedulerName = "" })
		if got := device("stock"); got != "node-a/g0-1x" {
			t.Errorf("the default scheduler gave the seat %s, want node-a/g0-1x (the published order's first)", got)
		}
		logPods(t, c, "a 1x seat on GPU 2, then one under kyb-scheduler and one under the default scheduler")
	})

	t.Run("an extended-resource pod is scored the same", func(t *testing.T) {
		defer clearPods(t, c)
		runningOn(t, c, "c-seat", seatFrom("seat-1x"), onNode("node-c"))
		var nodes []string
		for i := range 3 {
			nodes = append(nodes, runningOn(t, c, fmt.Sprintf("extended-%d", i), extended("kyb.ai/gpu-1x-seat", 1)))
		}
		logPods(t, c, "pods asking kyb.ai/gpu-1x-seat: 1 in limits, after one seat on node-c")
		if want := []string{"node-c", "node-c", "node-c"}; !slices.Equal(nodes, want) {
			t.Errorf("extended-resource pods ran on %v, want %v (packed onto the node in use)", nodes, want)
		}
	})

	t.Run("a gang is placed all at once", func(t *testing.T) {
		defer clearPods(t, c)
		gang(t, c, "gang-ok", 3)
		nodes := map[string]int{}
		for i := range 3 {
			pod, _, _ := c.WaitForPodRunning(t, "default", fmt.Sprintf("gang-ok-%d", i), timeout)
			nodes[pod.Spec.NodeName]++
		}
		logPods(t, c, "a gang of three 4x seat pods (PodGroup minCount 3)")
		if counts := slices.Sorted(maps.Values(nodes)); !slices.Equal(counts, []int{1, 2}) {
			t.Errorf("the gang ran on %v, want two on one node (pack) and one on another", nodes)
		}
	})

	// Four pods hold four of the six four-GPU groups; a gang of three
	// cannot complete. None of its pods is bound and none of its claims
	// allocated: it holds no seat that others could use. Once a group is
	// freed, the whole gang goes at once.
	t.Run("a gang that cannot complete holds no seat", func(t *testing.T) {
		defer clearPods(t, c)
		for i := range 4 {
			runningOn(t, c, fmt.Sprintf("big-%d", i), seatFrom("seat-4x"))
		}
		gang(t, c, "gang-wait", 3)
		for i := range 3 {
			c.WaitForPodUnschedulable(t, "default", fmt.Sprintf("gang-wait-%d", i), timeout)
		}
		// Long enough for several scheduling attempts (backoff 1-10 s).
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			for i := range 3 {
				name := fmt.Sprintf("gang-wait-%d", i)
				pod, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if pod.Spec.NodeName != "" {
					t.Fatalf("%s was bound to %s while its gang cannot complete", name, pod.Spec.NodeName)
				}
				if claim := harness.PodClaim(pod, "gpu"); claim != "" {
					if got := c.Allocation("default", claim); len(got) > 0 {
						t.Fatalf("%s's claim %s holds %v while its gang cannot complete", name, claim, got)
					}
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		logPods(t, c, "a gang of three 4x seat pods with two four-GPU groups free")
		c.DeletePod(t, "default", "big-0")
		for i := range 3 {
			c.WaitForPodRunning(t, "default", fmt.Sprintf("gang-wait-%d", i), timeout)
		}
		logPods(t, c, "the same gang once a third four-GPU group is free")
	})
}

// gang creates a PodGroup of n pods, all or none (minCount n), each with a
// 4x seat.
func gang(t *testing.T, c *harness.Cluster, name string, n int32) {
	t.Helper()
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: n},
		}},
	}
	if _, err := c.Client.SchedulingV1beta1().PodGroups("default").Create(c.Ctx, pg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PodGroup %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = c.Client.SchedulingV1beta1().PodGroups("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	for i := range n {
		kybPod(t, c, fmt.Sprintf("%s-%d", name, i), seatFrom("seat-4x"), inGang(name))
	}
}

// TestKybSchedulerWithoutTheGangAPI runs kyb-scheduler as it ships against
// an API server as Kubernetes 1.37 ships it: GenericWorkload off, the
// scheduling.k8s.io/v1beta1 API not served. kyb-scheduler turns gang
// scheduling off, says so, and places seat pods.
func TestKybSchedulerWithoutTheGangAPI(t *testing.T) {
	c := harness.Start(t, harness.Options{
		KybScheduler: &harness.KybSchedulerOptions{},
		Nodes:        []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100"}},
	})
	installClasses(t, c)
	createTemplate(t, c, "seat-1x", class1x)
	if node := runningOn(t, c, "seat", seatFrom("seat-1x")); node != "node-a" {
		t.Errorf("the seat pod ran on %q", node)
	}
	if log := c.KybScheduler.Tail(400); !strings.Contains(log, "gang scheduling is off") {
		t.Errorf("kyb-scheduler's log does not say that gang scheduling is off:\n%s", log)
	}
}
