package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// TestKybSchedulerPreempt runs kyb-scheduler's built-in profile (its
// preemption, KybPreemption, in DefaultPreemption's place) on a dgx-h100
// node beside the default scheduler, with the resource-claim controller
// releasing the claims of evicted pods and the node's kubelet loop
// confirming their deletion, as a cluster does.
func TestKybSchedulerPreempt(t *testing.T) {
	c := harness.Start(t, harness.Options{
		FeatureGates:   map[string]bool{"GenericWorkload": true},
		APIServerFlags: []string{"--runtime-config=scheduling.k8s.io/v1beta1=true"},
		KybScheduler:   &harness.KybSchedulerOptions{},
		Nodes:          []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100"}},
	})
	installClasses(t, c)
	createTemplate(t, c, "seat-4x", class4x)
	for gpu := range 8 {
		createTemplate(t, c, fmt.Sprintf("seat-1x-gpu%d", gpu), class1x, selector(fmt.Sprintf(`device.attributes["gpu.kyb.ai"].gpuIndices == "%d"`, gpu)))
	}
	for name, value := range map[string]int32{"low": 0, "high": 1000} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := c.Client.SchedulingV1().PriorityClasses().Create(c.Ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create PriorityClass %s: %v", name, err)
		}
		waitForPriorityClass(t, c, name)
	}
	defer func() {
		if t.Failed() {
			t.Logf("kyb-scheduler's log, last lines:\n%s", c.KybScheduler.Tail(80))
		}
	}()

	// The node's 1x seats of GPUs 0, 1, 2, 4 and 5 are held by
	// low-priority pods. A high-priority 4x pod evicts the pods of GPUs
	// 4 and 5, not those of 0, 1 and 2, and runs on the group of GPUs
	// 4-7 once they are gone.
	t.Run("the fewest victims", func(t *testing.T) {
		defer clearPods(t, c)
		for _, gpu := range []int{0, 1, 2, 4, 5} {
			runningOn(t, c, fmt.Sprintf("low-gpu%d", gpu), seatFrom(fmt.Sprintf("seat-1x-gpu%d", gpu)), priorityClass("low"))
		}
		logPods(t, c, "low-priority 1x seats on GPUs 0, 1, 2, 4 and 5")
		pod, _, _ := runningOnPod(t, c, "train", seatFrom("seat-4x"), priorityClass("high"))
		logPods(t, c, "a high-priority 4x pod after its preemption")
		if got := c.Allocation("default", harness.PodClaim(pod, "gpu")); !slices.Equal(got, []string{"node-a/g4567-4x"}) {
			t.Errorf("the 4x pod holds %v, want node-a/g4567-4x", got)
		}
		if got := podNames(t, c); !slices.Equal(got, []string{"low-gpu0", "low-gpu1", "low-gpu2", "train"}) {
			t.Errorf("pods left %v, want the seats of GPUs 0, 1 and 2 and the 4x pod", got)
		}
		if ev := preemptionEvents(t, c); !slices.Equal(ev, []string{"low-gpu4", "low-gpu5"}) {
			t.Errorf("pods preempted (events): %v, want low-gpu4 and low-gpu5", ev)
		}
	})

	// A gang of two high-priority 4x pods needs both four-GPU groups;
	// low-priority pods hold a seat in each. The gang preempts as one,
	// for both its pods, and both run.
	t.Run("a gang preempts for its whole gang", func(t *testing.T) {
		defer clearPods(t, c)
		runningOn(t, c, "low-gpu0", seatFrom("seat-1x-gpu0"), priorityClass("low"))
		runningOn(t, c, "low-gpu5", seatFrom("seat-1x-gpu5"), priorityClass("low"))
		pg := &schedulingv1beta1.PodGroup{
			ObjectMeta: metav1.ObjectMeta{Name: "trainers", Namespace: "default"},
			Spec: schedulingv1beta1.PodGroupSpec{
				SchedulingPolicy:  schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}},
				PriorityClassName: "high",
			},
		}
		if _, err := c.Client.SchedulingV1beta1().PodGroups("default").Create(c.Ctx, pg, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create PodGroup: %v", err)
		}
		t.Cleanup(func() {
			_ = c.Client.SchedulingV1beta1().PodGroups("default").Delete(context.Background(), pg.Name, metav1.DeleteOptions{})
		})
		for i := range 2 {
			kybPod(t, c, fmt.Sprintf("trainer-%d", i), seatFrom("seat-4x"), inGang(pg.Name), priorityClass("high"))
		}
		var groups []string
		for i := range 2 {
			pod, _, _ := c.WaitForPodRunning(t, "default", fmt.Sprintf("trainer-%d", i), timeout)
			groups = append(groups, c.Allocation("default", harness.PodClaim(pod, "gpu"))...)
		}
		slices.Sort(groups)
		logPods(t, c, "a gang of two high-priority 4x pods after its preemption")
		if !slices.Equal(groups, []string{"node-a/g0123-4x", "node-a/g4567-4x"}) {
			t.Errorf("the gang holds %v, want both four-GPU groups", groups)
		}
		if got := podNames(t, c); !slices.Equal(got, []string{"trainer-0", "trainer-1"}) {
			t.Errorf("pods left %v, want the gang's alone", got)
		}
	})
}

// waitForPriorityClass waits until the API server's Priority admission
// plugin, which reads PriorityClasses from its informer, knows the class:
// until then a pod naming it is refused.
func waitForPriorityClass(t *testing.T, c *harness.Cluster, name string) {
	t.Helper()
	probe := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "priority-probe", Namespace: "default"},
		Spec: v1.PodSpec{
			PriorityClassName: name,
			Containers:        []v1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	var last error
	err := wait.PollUntilContextTimeout(c.Ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, last = c.Client.CoreV1().Pods("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("PriorityClass %s is not known to the API server's admission after %v: %v", name, timeout, last)
	}
}

func priorityClass(name string) podOpt {
	return func(p *v1.Pod) { p.Spec.PriorityClassName = name }
}

// runningOnPod creates a pod and returns it once running.
func runningOnPod(t *testing.T, c *harness.Cluster, name string, opts ...podOpt) (*v1.Pod, *harness.Node, map[string]*harness.Container) {
	t.Helper()
	kybPod(t, c, name, opts...)
	return c.WaitForPodRunning(t, "default", name, timeout)
}

func podNames(t *testing.T, c *harness.Cluster) []string {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// preemptionEvents are the pods the scheduler's Preempted events name.
func preemptionEvents(t *testing.T, c *harness.Cluster) []string {
	t.Helper()
	events, err := c.Client.EventsV1().Events("default").List(c.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events.Items {
		if e.Reason == "Preempted" && !slices.Contains(out, e.Regarding.Name) {
			out = append(out, e.Regarding.Name)
		}
	}
	slices.Sort(out)
	return out
}
