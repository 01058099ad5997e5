package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// sizedConfig gives GPU 0 of a dgx-h100 (81559 MiB, 79.6 GiB) to sized
// seats, at most four claims.
const sizedConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 4
  gpus: [0]
  sharing: {strategy: mps, sized: true}
`

const classSized = "gpu-1x-sized.kyb.ai"

// size asks a request's memory and compute.
func size(memory, compute string) func(*resourceapi.ExactDeviceRequest) {
	return func(r *resourceapi.ExactDeviceRequest) {
		r.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory), "compute": resource.MustParse(compute),
		}}
	}
}

// Sized seats through the API server, the scheduler and the kubelet: the
// API server takes the sized group's slice, the scheduler gives a pod
// the size its claim asked (a request off the step rounded up) and keeps
// one that asks more than the group has left Pending with its reason, the
// pod's container is an MPS client held to its size, the claim's status
// says it, and the Pending pod runs once the others' sizes are released.
func TestSizedSeatsEndToEnd(t *testing.T) {
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{
		Name: "node-a", Preset: "dgx-h100", Config: sizedConfig,
		PluginArgs: []string{"--mps-root", root, "--mps-control", control},
	}}})
	installClasses(t, c)
	if err := c.CreateDeviceClasses(c.Ctx, "dgx-h100", sizedConfig); err != nil {
		t.Fatal(err)
	}
	createTemplate(t, c, "small", classSized, size("20Gi", "25"))
	createTemplate(t, c, "off-step", classSized, size("20.5Gi", "12.5"))
	createTemplate(t, c, "big", classSized, size("70Gi", "50"))

	createPod(t, c, podSpec{name: "small", claims: fromTemplate("small")})
	pod, _, ctrs := c.WaitForPodRunning(t, "default", "small", timeout)
	env := ctrs["app"].Env
	for k, want := range map[string]string{
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
		"KYB_SEAT_MEMORY": "21474836480", "KYB_SEAT_COMPUTE": "25",
	} {
		if env[k] != want {
			t.Errorf("pod small: %s=%q, want %q", k, env[k], want)
		}
	}
	pipe := filepath.Join(root, "g0-1x-sized", "pipe")
	if got := mpstest.Join(t, control, pipe, "100", "0=80G"); got != "thread=25 mem=0=20480M" {
		t.Errorf("a client raising its limits got %q from the daemon, want the pod's size", got)
	}
	claim := harness.PodClaim(pod, "gpu")
	cl, err := c.Client.ResourceV1().ResourceClaims("default").Get(c.Ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := consumedOf(cl); got != "g0-1x-sized compute=25 memory=20Gi seats=1 shared" {
		t.Errorf("claim %s's allocation: %s", claim, got)
	}
	// The claim's status says its size (written a second behind the
	// prepare).
	var status v1alpha1.SeatStatus
	err = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		cl, err := c.Client.ResourceV1().ResourceClaims("default").Get(ctx, claim, metav1.GetOptions{})
		if err != nil || len(cl.Status.Devices) == 0 || cl.Status.Devices[0].Data == nil {
			return false, nil
		}
		return json.Unmarshal(cl.Status.Devices[0].Data.Raw, &status) == nil, nil
	})
	if err != nil || status.Size == nil || *status.Size != (v1alpha1.SeatSize{MemoryBytes: 20 << 30, ComputePercent: 25}) {
		t.Errorf("claim %s's status: %+v (%v), want its size", claim, status, err)
	}

	// Off the step: rounded up to 21Gi and 13 %.
	createPod(t, c, podSpec{name: "off-step", claims: fromTemplate("off-step")})
	_, _, ctrs = c.WaitForPodRunning(t, "default", "off-step", timeout)
	if env := ctrs["app"].Env; env["KYB_SEAT_MEMORY"] != "22548578304" || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "13" || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=21504M" {
		t.Errorf("pod off-step: memory %s, %s %%, %s; want 21Gi and 13 %%", env["KYB_SEAT_MEMORY"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}

	// 70Gi beside 41Gi on 79.6Gi: the scheduler's allocator refuses it.
	createPod(t, c, podSpec{name: "big", claims: fromTemplate("big")})
	if msg := c.WaitForPodUnschedulable(t, "default", "big", timeout); !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod big unschedulable with %q, want the allocator's reason", msg)
	}
	c.DeletePod(t, "default", "small")
	c.DeletePod(t, "default", "off-step")
	_, _, ctrs = c.WaitForPodRunning(t, "default", "big", timeout)
	if env := ctrs["app"].Env; env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=71680M" || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "50" {
		t.Errorf("pod big once the others went: %s, %s %%", env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
	}
}

// consumedOf renders a claim's one allocation result: its device, the
// capacities it consumed in name order, and whether it is a share.
func consumedOf(cl *resourceapi.ResourceClaim) string {
	if cl.Status.Allocation == nil || len(cl.Status.Allocation.Devices.Results) != 1 {
		return "not one result"
	}
	r := cl.Status.Allocation.Devices.Results[0]
	out := r.Device
	for _, name := range []resourceapi.QualifiedName{"compute", "memory", "seats"} {
		if q, ok := r.ConsumedCapacity[name]; ok {
			out += " " + string(name) + "=" + q.String()
		}
	}
	if r.ShareID != nil {
		out += " shared"
	}
	return out
}
