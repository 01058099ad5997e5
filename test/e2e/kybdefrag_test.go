package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// TestKybSchedulerDefragment runs kyb-scheduler with --defragmentation=on
// on two dgx-h100 nodes beside the real ReplicaSet controller, the
// resource-claim controller releasing the claims of evicted pods and the
// nodes' kubelet loops confirming their deletion. Six GPUs are free, and
// no four-GPU group: node-a's group 0-3 is broken by a ReplicaSet's seat
// on GPU 0 (its template asks for GPU 0 of any node), node-b's by a pod
// of its own on GPU 1, the groups 4-7 of both are held. A 4x pod of the
// same priority (no preemption) waits; defragmentation evicts the
// ReplicaSet's pod, whose replacement the controller creates and the
// scheduler places on GPU 0 of node-b, and the 4x pod runs on node-a's
// group 0-3.
func TestKybSchedulerDefragment(t *testing.T) {
	c := harness.Start(t, harness.Options{
		KybScheduler: &harness.KybSchedulerOptions{Args: []string{"--defragmentation=on"}},
		Nodes:        []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100"}, {Name: "node-b", Preset: "dgx-h100"}},
	})
	installClasses(t, c)
	createTemplate(t, c, "seat-4x", class4x)
	createTemplate(t, c, "seat-4x-gpu4567", class4x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "4,5,6,7"`))
	for _, gpu := range []string{"0", "1"} {
		createTemplate(t, c, "seat-1x-gpu"+gpu, class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "`+gpu+`"`))
	}
	defer func() {
		if t.Failed() {
			t.Logf("kyb-scheduler's log, last lines:\n%s", c.KybScheduler.Tail(80))
		}
	}()
	startReplicaSetController(t, c)

	// node-b full while the ReplicaSet's pod is placed, so that it goes
	// to GPU 0 of node-a.
	runningOn(t, c, "a-gpu4567", seatFrom("seat-4x-gpu4567"), onNode("node-a"))
	runningOn(t, c, "b-first", seatFrom("seat-4x"), onNode("node-b"))
	runningOn(t, c, "b-second", seatFrom("seat-4x"), onNode("node-b"))
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "workers", Namespace: "default"},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "workers"}},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "workers"}},
				Spec: v1.PodSpec{
					SchedulerName:  kybScheduler,
					ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("seat-1x-gpu0")}},
					Containers: []v1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10",
						Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().ReplicaSets("default").Create(c.Ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	worker := workers(t, c, "the ReplicaSet's pod running", func(p v1.Pod) bool { return true })
	if worker.Spec.NodeName != "node-a" {
		t.Fatalf("the ReplicaSet's pod runs on %s, want node-a (node-b is full)", worker.Spec.NodeName)
	}
	// node-b's group 0-3 goes, and a pod of its own breaks it.
	for _, name := range []string{"b-first", "b-second"} {
		pod, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(c.Allocation("default", harness.PodClaim(pod, "gpu")), []string{"node-b/g0123-4x"}) {
			c.DeletePod(t, "default", name)
		}
	}
	runningOn(t, c, "b-gpu1", seatFrom("seat-1x-gpu1"), onNode("node-b"))
	logPods(t, c, "six GPUs free, no four-GPU group: the ReplicaSet's seat on GPU 0 of node-a, a pod's on GPU 1 of node-b")

	pod, _, _ := runningOnPod(t, c, "train", seatFrom("seat-4x"))
	logPods(t, c, "a 4x pod after defragmentation")
	if got := c.Allocation("default", harness.PodClaim(pod, "gpu")); !slices.Equal(got, []string{"node-a/g0123-4x"}) {
		t.Errorf("the 4x pod holds %v, want node-a/g0123-4x", got)
	}
	moved := workers(t, c, "the ReplicaSet's replacement running", func(p v1.Pod) bool { return p.Name != worker.Name })
	if got := c.Allocation("default", harness.PodClaim(moved, "gpu")); moved.Spec.NodeName != "node-b" || !slices.Equal(got, []string{"node-b/g0-1x"}) {
		t.Errorf("the replacement %s runs on %s holding %v, want node-b/g0-1x", moved.Name, moved.Spec.NodeName, got)
	}
	if got := podNames(t, c); !slices.Equal(got, sorted("a-gpu4567", "b-gpu1", "b-second", moved.Name, "train")) && !slices.Equal(got, sorted("a-gpu4567", "b-gpu1", "b-first", moved.Name, "train")) {
		t.Errorf("pods %v: want node-b's pods, the 4x pods and the replacement only", got)
	}
	events, err := c.Client.EventsV1().Events("default").List(c.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var evicted, waiting []string
	for _, e := range events.Items {
		switch e.Reason {
		case "Defragmented":
			if e.Related == nil || e.Related.Name != "train" || !strings.Contains(e.Note, "for pod default/train") {
				t.Errorf("event Defragmented on %s does not name the 4x pod: related %v, note %q", e.Regarding.Name, e.Related, e.Note)
			}
			evicted = append(evicted, e.Regarding.Name)
		case "Defragmenting":
			if !strings.Contains(e.Note, "default/"+worker.Name) {
				t.Errorf("event Defragmenting on %s does not name the moved pod: %q", e.Regarding.Name, e.Note)
			}
			waiting = append(waiting, e.Regarding.Name)
		}
	}
	if !slices.Equal(evicted, []string{worker.Name}) || !slices.Equal(waiting, []string{"train"}) {
		t.Errorf("events: Defragmented on %v, Defragmenting on %v; want on %s and on train", evicted, waiting, worker.Name)
	}
}

// workers waits for the ReplicaSet's one pod that is running and matches,
// the others gone.
func workers(t *testing.T, c *harness.Cluster, what string, match func(v1.Pod) bool) *v1.Pod {
	t.Helper()
	var out *v1.Pod
	waitUntil(t, c, what, func(ctx context.Context) bool {
		l, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=workers"})
		if err != nil || len(l.Items) != 1 || l.Items[0].Status.Phase != v1.PodRunning || !match(l.Items[0]) {
			return false
		}
		out = &l.Items[0]
		return true
	})
	return out
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}
