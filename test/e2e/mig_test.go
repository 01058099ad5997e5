package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// migConfig gives GPUs 0 and 1 to 1g.10gb MIG seats, seven per GPU,
// beside the whole-GPU 1x groups on every GPU.
const migConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0, 1]}
`

const classMIG1g = "mig-1g.10gb.kyb.ai"

// onGPU narrows a request to the devices of GPU i.
func onGPU(i int) string {
	return fmt.Sprintf(`device.attributes["gpu.kyb.ai"].gpuIndices == "%d"`, i)
}

// migDevice checks that a container was given one MIG device of GPU gpu:
// CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES name one MIG- UUID, and
// its device nodes are its parent's /dev/nvidiaN and two capability
// nodes (the GPU instance's and the compute instance's). It returns the
// UUID.
func migDevice(t *testing.T, pod string, ctr *harness.Container, gpu int) string {
	t.Helper()
	uuid := ctr.Env["CUDA_VISIBLE_DEVICES"]
	if !strings.HasPrefix(uuid, "MIG-") || strings.Contains(uuid, ",") || ctr.Env["NVIDIA_VISIBLE_DEVICES"] != uuid {
		t.Errorf("pod %s: CUDA_VISIBLE_DEVICES=%q NVIDIA_VISIBLE_DEVICES=%q, want one MIG- UUID in both", pod, uuid, ctr.Env["NVIDIA_VISIBLE_DEVICES"])
	}
	var caps []string
	for _, p := range ctr.DeviceNodePaths() {
		if strings.HasPrefix(p, "/dev/nvidia-caps/nvidia-cap") {
			caps = append(caps, p)
		}
	}
	if nodes := gpuNodes(ctr); !slices.Equal(nodes, []string{fmt.Sprintf("/dev/nvidia%d", gpu)}) || len(caps) != 2 {
		t.Errorf("pod %s: GPU device nodes %v and capability nodes %v, want /dev/nvidia%d and two nvidia-caps nodes", pod, nodes, caps, gpu)
	}
	return uuid
}

// TestMIGSeatsAndWholeGPUGroupsThroughTheScheduler: on a node whose GPUs 0
// and 1 have both MIG seats and whole-GPU 1x groups, the real scheduler
// never allocates a MIG seat and a 1x group on the same GPU. A 1x claim on
// GPU 1 keeps GPU 1's MIG seats off; seven MIG seats fill GPU 0, after
// which a 1x claim on GPU 0 stays pending and one on any GPU goes to
// another; the 1x claim's release lets GPU 1's MIG seat in. A legacy pod
// asking for kyb.ai/mig-1g.10gb in its limits is served by the
// DeviceClass's extended-resource mapping with a MIG device.
func TestMIGSeatsAndWholeGPUGroupsThroughTheScheduler(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100", Config: migConfig}}})
	installClasses(t, c)
	if err := c.CreateDeviceClasses(c.Ctx, "dgx-h100", migConfig); err != nil {
		t.Fatal(err)
	}
	node := c.Node("node-a")
	for i := range 2 {
		createTemplate(t, c, fmt.Sprintf("whole-gpu%d", i), class1x, selector(onGPU(i)))
		createTemplate(t, c, fmt.Sprintf("mig-gpu%d", i), classMIG1g, selector(onGPU(i)))
	}
	createTemplate(t, c, "whole-any", class1x)
	createTemplate(t, c, "mig-any", classMIG1g)

	// A 1x group on GPU 1 keeps GPU 1's MIG seats off.
	createPod(t, c, podSpec{name: "whole-1", claims: fromTemplate("whole-gpu1")})
	_, _, ctrs := c.WaitForPodRunning(t, "default", "whole-1", timeout)
	if got := ctrs["app"].Env["CUDA_VISIBLE_DEVICES"]; got != node.GPUUUID(1) {
		t.Errorf("pod whole-1: CUDA_VISIBLE_DEVICES=%q, want GPU 1's %s", got, node.GPUUUID(1))
	}
	createPod(t, c, podSpec{name: "mig-on-1", claims: fromTemplate("mig-gpu1")})
	if msg := c.WaitForPodUnschedulable(t, "default", "mig-on-1", timeout); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod mig-on-1 unschedulable with %q, want the claims that cannot be allocated", msg)
	}

	// Seven MIG seats fill GPU 0 (GPU 1's are kept off by the 1x group),
	// one pod after the other: stock kube-scheduler may count a seat of a
	// pod still binding as taken and refuse a free one.
	uuids := map[string]string{}
	for i := range 7 {
		name := fmt.Sprintf("mig-%d", i)
		createPod(t, c, podSpec{name: name, claims: fromTemplate("mig-any")})
		_, _, ctrs := c.WaitForPodRunning(t, "default", name, timeout)
		u := migDevice(t, name, ctrs["app"], 0)
		if other, twice := uuids[u]; twice {
			t.Errorf("pods %s and %s were given the same MIG device %s", other, name, u)
		}
		uuids[u] = name
	}
	createPod(t, c, podSpec{name: "whole-0", claims: fromTemplate("whole-gpu0")})
	if msg := c.WaitForPodUnschedulable(t, "default", "whole-0", timeout); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod whole-0 unschedulable with %q, want the claims that cannot be allocated", msg)
	}
	createPod(t, c, podSpec{name: "whole-other", claims: fromTemplate("whole-any")})
	_, _, ctrs = c.WaitForPodRunning(t, "default", "whole-other", timeout)
	if got := ctrs["app"].Env["CUDA_VISIBLE_DEVICES"]; got == node.GPUUUID(0) || got == node.GPUUUID(1) || !strings.HasPrefix(got, "GPU-") {
		t.Errorf("pod whole-other: CUDA_VISIBLE_DEVICES=%q, want a GPU other than 0 (full of MIG seats) and 1 (taken)", got)
	}

	// The 1x group's release lets GPU 1's MIG seat in; GPU 0 stays full.
	c.DeletePod(t, "default", "whole-1")
	_, _, ctrs = c.WaitForPodRunning(t, "default", "mig-on-1", timeout)
	migDevice(t, "mig-on-1", ctrs["app"], 1)
	if msg := c.WaitForPodUnschedulable(t, "default", "whole-0", timeout); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod whole-0 unschedulable with %q after GPU 1 was freed, want it still pending", msg)
	}

	// A legacy pod: the extended resource in its limits, no claim.
	createPod(t, c, podSpec{name: "legacy", limits: v1.ResourceList{"kyb.ai/mig-1g.10gb": resource.MustParse("1")}})
	pod, _, ctrs := c.WaitForPodRunning(t, "default", "legacy", timeout)
	u := migDevice(t, "legacy", ctrs["app"], 1)
	if _, twice := uuids[u]; twice {
		t.Errorf("pod legacy was given MIG device %s, pod %s's", u, uuids[u])
	}
	if pod.Status.ExtendedResourceClaimStatus == nil || pod.Status.ExtendedResourceClaimStatus.ResourceClaimName == "" {
		t.Fatalf("pod legacy has no extended-resource claim: %+v", pod.Status.ExtendedResourceClaimStatus)
	}
	alloc := c.Allocation("default", pod.Status.ExtendedResourceClaimStatus.ResourceClaimName)
	if len(alloc) != 1 || !strings.HasPrefix(alloc[0], "node-a/g1-mig-1g-10gb-") {
		t.Errorf("pod legacy's claim was allocated %v, want one of GPU 1's 1g.10gb placements", alloc)
	}
	// Its CDI device is the allocated MIG device's (beside the kubelet's
	// device metadata).
	var gpus []string
	for _, id := range ctrs["app"].CDIDevices {
		if strings.HasPrefix(id, "kyb.ai/gpu=") {
			gpus = append(gpus, id)
		}
	}
	if len(gpus) != 1 || len(alloc) != 1 || !strings.HasSuffix(gpus[0], "-"+strings.TrimPrefix(alloc[0], "node-a/")) {
		t.Errorf("pod legacy's container has CDI devices %v, want one of kyb.ai/gpu, its allocated %v", ctrs["app"].CDIDevices, alloc)
	}
}
