package e2e

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// standaloneClaim creates a ResourceClaim (not from a template) for one
// 1x seat of GPU gpu.
func standaloneClaim(t *testing.T, c *harness.Cluster, name, gpu string) {
	t.Helper()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: class1x,
			Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.kyb.ai"].gpuIndices == "` + gpu + `"`}}},
		}}},
	}}}
	if _, err := c.Client.ResourceV1().ResourceClaims("default").Create(c.Ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// podWith creates a pod on node whose containers reference the pod's
// claims named in each entry of containers (in that order).
func podWith(t *testing.T, c *harness.Cluster, name, node string, claims []v1.PodResourceClaim, containers map[string][]string) {
	t.Helper()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: v1.PodSpec{
		NodeSelector: map[string]string{"kubernetes.io/hostname": node}, ResourceClaims: claims,
	}}
	for ctr, refs := range containers {
		container := v1.Container{Name: ctr, Image: "registry.k8s.io/pause:3.10"}
		for _, r := range refs {
			container.Resources.Claims = append(container.Resources.Claims, v1.ResourceClaim{Name: r})
		}
		pod.Spec.Containers = append(pod.Spec.Containers, container)
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
}

func direct(podClaim, claim string) v1.PodResourceClaim {
	return v1.PodResourceClaim{Name: podClaim, ResourceClaimName: ptr.To(claim)}
}

func template(podClaim, tmpl string) v1.PodResourceClaim {
	return v1.PodResourceClaim{Name: podClaim, ResourceClaimTemplateName: ptr.To(tmpl)}
}

// gpuNodes lists a container's GPU device nodes.
func gpuNodes(ctr *harness.Container) []string {
	var out []string
	for _, p := range ctr.DeviceNodePaths() {
		if rest := strings.TrimPrefix(p, "/dev/nvidia"); rest != p && rest != "" && strings.Trim(rest, "0123456789") == "" {
			out = append(out, p)
		}
	}
	return out
}

// What a container is told of its GPUs follows what it holds, as the
// kubelet's PodResources API says: a claim no container holds beside
// another of the driver's names its own GPUs by UUID (a standalone claim,
// one two pods share, one with admin access); a container holding two
// names exactly as many GPUs by index as it has; and a standalone claim a
// later pod's container holds beside its own is written again for it.
func TestSeatsNameTheGPUsOfTheContainer(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100", Config: seedConfig}}})
	installClasses(t, c)
	node := c.Node("node-a")

	standaloneClaim(t, c, "lone", "4")
	podWith(t, c, "lone", "node-a", []v1.PodResourceClaim{direct("gpu", "lone")}, map[string][]string{"app": {"gpu"}})
	_, _, ctrs := c.WaitForPodRunning(t, "default", "lone", timeout)
	if got, want := ctrs["app"].Env["CUDA_VISIBLE_DEVICES"], node.GPUUUID(4); got != want {
		t.Errorf("a fresh standalone claim, one pod, one container: CUDA_VISIBLE_DEVICES=%s, want %s", got, want)
	}

	// A claim two pods share, each alone in its container. One after the
	// other: a pod the scheduler reserved the claim for but the kubelet
	// does not know yet is one it cannot answer for, and the claim is
	// then combined the conservative way.
	standaloneClaim(t, c, "shared", "5")
	for _, name := range []string{"share-1", "share-2"} {
		podWith(t, c, name, "node-a", []v1.PodResourceClaim{direct("gpu", "shared")}, map[string][]string{"app": {"gpu"}})
		_, _, ctrs := c.WaitForPodRunning(t, "default", name, timeout)
		if got, want := ctrs["app"].Env["CUDA_VISIBLE_DEVICES"], node.GPUUUID(5); got != want {
			t.Errorf("a claim two pods share, pod %s: CUDA_VISIBLE_DEVICES=%s, want %s", name, got, want)
		}
	}

	// Admin access.
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring", Labels: map[string]string{"resource.kubernetes.io/admin-access": "true"}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	monitorPod(t, c, "monitoring", "watch", "node-a", "6")
	_, _, ctrs = c.WaitForPodRunning(t, "monitoring", "watch", timeout)
	if env := ctrs["app"].Env; env["KYB_ADMIN_ACCESS"] != "true" || env["CUDA_VISIBLE_DEVICES"] != node.GPUUUID(6) {
		t.Errorf("an admin-access claim: %v, want CUDA_VISIBLE_DEVICES=%s", env, node.GPUUUID(6))
	}

	// One container with a 1x and a 2x claim: three GPUs, three entries.
	createTemplate(t, c, "two-1x", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
	createTemplate(t, c, "two-2x", class2x, selector(`device.attributes["gpu.kyb.ai"].group == "G23"`))
	podWith(t, c, "two", "node-a", []v1.PodResourceClaim{template("small", "two-1x"), template("big", "two-2x")},
		map[string][]string{"app": {"small", "big"}, "solo": {"small"}})
	_, _, ctrs = c.WaitForPodRunning(t, "default", "two", timeout)
	if n := len(gpuNodes(ctrs["app"])); n != 3 || ctrs["app"].Env["CUDA_VISIBLE_DEVICES"] != "0,1,2" || ctrs["app"].Env["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" {
		t.Errorf("a container with two claims: %d GPU device nodes, CUDA_VISIBLE_DEVICES=%s", n, ctrs["app"].Env["CUDA_VISIBLE_DEVICES"])
	}

	// A later pod whose container holds the lone claim beside its own
	// (listed last, so that its spec is the one applied last): the lone
	// claim's spec is written again.
	createTemplate(t, c, "later-1x", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "7"`))
	podWith(t, c, "later", "node-a", []v1.PodResourceClaim{template("own", "later-1x"), direct("lone", "lone")}, map[string][]string{"app": {"own", "lone"}})
	_, _, ctrs = c.WaitForPodRunning(t, "default", "later", timeout)
	if got := gpuNodes(ctrs["app"]); len(got) != 2 || ctrs["app"].Env["CUDA_VISIBLE_DEVICES"] != "0,1" {
		t.Errorf("a standalone claim beside a later pod's own: GPU device nodes %v, CUDA_VISIBLE_DEVICES=%s, want two and 0,1", got, ctrs["app"].Env["CUDA_VISIBLE_DEVICES"])
	}
}
