package e2enode

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// sizedConfig gives GPU 0 of a dgx-h100 (81559 MiB) to sized seats, at
// most four claims; a claim that asks nothing gets a quarter: 19Gi (the
// step below 19.9 GiB) and 25 %.
const sizedConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 4
  gpus: [0]
  sharing: {strategy: mps, sized: true}
`

const classSized = "gpu-1x-sized.kyb.ai"

// sizedTemplate creates a template asking the sized class for a size;
// memory and compute empty: the profile's default.
func sizedTemplate(t *testing.T, c *harness.Cluster, name, memory, compute string) {
	t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: classSized, Count: 1}
	if memory != "" {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory), "compute": resource.MustParse(compute),
		}}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}},
		}}},
	}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(c.Ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create claim template %s: %v", name, err)
	}
}

// isSizedSeat checks that a sized seat's container says its size in its
// environment and device metadata, that the claim's allocation consumed
// that size and that the plugin recorded it in the claim's status.
func isSizedSeat(t *testing.T, c *harness.Cluster, pod string, o output, size v1alpha1.SeatSize) {
	t.Helper()
	memory, compute := resource.NewQuantity(size.MemoryBytes, resource.BinarySI), resource.NewQuantity(size.ComputePercent, resource.DecimalSI)
	for k, want := range map[string]string{"KYB_SEAT_MEMORY": strconv.FormatInt(size.MemoryBytes, 10), "KYB_SEAT_COMPUTE": strconv.FormatInt(size.ComputePercent, 10)} {
		if o.env[k] != want {
			t.Errorf("pod %s: %s=%q, want %q", pod, k, o.env[k], want)
		}
	}
	var meta []int64
	for _, attrs := range metadataAttributes(t, o) {
		for _, name := range []resourceapi.QualifiedName{"seatMemory", "seatCompute"} {
			if a, ok := attrs[name]; ok && a.IntValue != nil {
				meta = append(meta, *a.IntValue)
			}
		}
	}
	if len(meta) != 2 || meta[0] != size.MemoryBytes || meta[1] != size.ComputePercent {
		t.Errorf("pod %s: device metadata seatMemory and seatCompute %v, want %d and %d", pod, meta, size.MemoryBytes, size.ComputePercent)
	}

	p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim := harness.PodClaim(p, "gpu")
	var consumed map[resourceapi.QualifiedName]resource.Quantity
	var status v1alpha1.SeatStatus
	// The plugin writes the status a moment after the prepare.
	err = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cl, err := c.Client.ResourceV1().ResourceClaims("default").Get(ctx, claim, metav1.GetOptions{})
		if err != nil || cl.Status.Allocation == nil || len(cl.Status.Allocation.Devices.Results) != 1 ||
			len(cl.Status.Devices) == 0 || cl.Status.Devices[0].Data == nil {
			return false, nil
		}
		consumed = cl.Status.Allocation.Devices.Results[0].ConsumedCapacity
		return json.Unmarshal(cl.Status.Devices[0].Data.Raw, &status) == nil, nil
	})
	if err != nil {
		t.Fatalf("claim %s of pod %s: no allocation and status (%v)", claim, pod, err)
	}
	if m, cp := consumed["memory"], consumed["compute"]; m.Cmp(*memory) != 0 || cp.Cmp(*compute) != 0 {
		t.Errorf("claim %s consumed memory %s and compute %s, want %s and %s", claim, m.String(), cp.String(), memory, compute)
	}
	if status.Size == nil || *status.Size != size {
		t.Errorf("claim %s's status records size %+v, want %+v", claim, status.Size, size)
	}
}

// Sized seats on a real node: two pods whose claims ask for different
// sizes of one GPU (20Gi and 40 %, and nothing: the profile's default)
// get their own MPS limits and say their size in their environment and
// device metadata; a client in the first asking the daemon for the whole
// GPU gets its claim's size, one in the second with its container's
// limits the smaller size; the claims' allocations consumed the sizes and
// their statuses record them. A third claim for more memory than the
// group has left (41Gi where 40.6Gi is) stays Pending with the
// allocator's reason while the node serves on, and runs with its size
// once the first pod's is released.
func TestSizedSeatsOnARealNode(t *testing.T) {
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	c := startCluster(t)
	if err := c.CreateDeviceClasses(c.Ctx, "dgx-h100", sizedConfig); err != nil {
		t.Fatal(err)
	}
	n, _ := startNode(t, c, realnode.Options{Name: "node-sz", Preset: "dgx-h100", Config: sizedConfig,
		PluginArgs: []string{"--mps-root", root, "--mps-control", control},
		ImageFiles: map[string]string{"bin/nvidia-cuda-mps-control": control}})

	sizedTemplate(t, c, "sized-20g", "20Gi", "40")
	sizedTemplate(t, c, "sized-default", "", "")
	sizedTemplate(t, c, "sized-41g", "41Gi", "25")

	// Alone on its group, the client asking for the whole GPU gets the
	// claim's size.
	createPod(t, c, podSpec{name: "sized-20g", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "sized-20g")},
		command: mpsClientCommand + probe})
	o := waitForOutput(t, c, "sized-20g", "app")
	t.Logf("pod sized-20g's container printed:\n%s", o.raw)
	isMPSClient(t, o, "40", "0=20480M")
	isSizedSeat(t, c, "sized-20g", o, v1alpha1.SeatSize{MemoryBytes: 20 << 30, ComputePercent: 40})

	// The client with the container's own limits gets its size, below
	// the largest the daemon holds.
	createPod(t, c, podSpec{name: "sized-default", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "sized-default")},
		command: `echo "MPS_CLIENT=$(nvidia-cuda-mps-control --client 2>&1)"; ` + probe})
	o = waitForOutput(t, c, "sized-default", "app")
	t.Logf("pod sized-default's container printed:\n%s", o.raw)
	isMPSClient(t, o, "25", "0=19456M")
	isSizedSeat(t, c, "sized-default", o, v1alpha1.SeatSize{MemoryBytes: 19 << 30, ComputePercent: 25})

	createPod(t, c, podSpec{name: "sized-41g", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "sized-41g")}})
	msg := c.WaitForPodUnschedulable(t, "default", "sized-41g", time.Minute)
	t.Logf("pod sized-41g Pending: %s", msg)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("pod sized-41g unschedulable with %q, want the allocator's reason", msg)
	}
	assertRunning(t, c, "sized-20g", "sized-default")

	deletePod(t, c, "sized-20g")
	o = waitForOutput(t, c, "sized-41g", "app")
	if o.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=41984M" || o.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" {
		t.Errorf("pod sized-41g once sized-20g went: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q, want 0=41984M and 25",
			o.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], o.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
	}
	isSizedSeat(t, c, "sized-41g", o, v1alpha1.SeatSize{MemoryBytes: 41 << 30, ComputePercent: 25})

	deletePod(t, c, "sized-default")
	deletePod(t, c, "sized-41g")
	waitUntil(t, "the daemon of the sized group gone with its last pod", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(root, "g0-1x-sized"))
		return os.IsNotExist(err)
	})
}
