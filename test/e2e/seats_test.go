package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

const (
	class1x = "gpu-1x-seat.kyb.ai"
	class2x = "gpu-2x-seat.kyb.ai"
	class4x = "gpu-4x-seat.kyb.ai"
	timeout = 60 * time.Second
)

// seedConfig is the seat design's example: 1x with 4 seats, 2x with 3.
const seedConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
groups: [{name: G01, gpus: [0, 1]}, {name: G23, gpus: [2, 3]}]
`

// overprovisionConfig time-shares 1x seats with the 4x groups.
const overprovisionConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, allowOverprovision: true}
- {resource: kyb.ai/gpu-4x-seat}
`

func installClasses(t *testing.T, c *harness.Cluster) {
	t.Helper()
	if _, err := c.ApplyFile(filepath.Join(repoRoot(), "deployments/static/deviceclasses.yaml"), harness.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
}

type podSpec struct {
	name       string
	node       string // nodeSelector on kubernetes.io/hostname
	containers []string
	claims     []v1.PodResourceClaim
	limits     v1.ResourceList
}

func createPod(t *testing.T, c *harness.Cluster, p podSpec) *v1.Pod {
	t.Helper()
	if len(p.containers) == 0 {
		p.containers = []string{"app"}
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default"}, Spec: v1.PodSpec{ResourceClaims: p.claims}}
	if p.node != "" {
		pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": p.node}
	}
	for _, name := range p.containers {
		ctr := v1.Container{Name: name, Image: "registry.k8s.io/pause:3.10"}
		for _, rc := range p.claims {
			ctr.Resources.Claims = append(ctr.Resources.Claims, v1.ResourceClaim{Name: rc.Name})
		}
		if p.limits != nil {
			ctr.Resources.Limits = p.limits
		}
		pod.Spec.Containers = append(pod.Spec.Containers, ctr)
	}
	created, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.name, err)
	}
	return created
}

func createTemplate(t *testing.T, c *harness.Cluster, name, class string, mutate ...func(*resourceapi.ExactDeviceRequest)) {
	t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class}
	for _, m := range mutate {
		m(req)
	}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}},
		}}}}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(c.Ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func fromTemplate(tmpl string) []v1.PodResourceClaim {
	return []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}}
}

func selector(expr string) func(*resourceapi.ExactDeviceRequest) {
	return func(r *resourceapi.ExactDeviceRequest) {
		r.Selectors = append(r.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	}
}

// TestSeats runs the scenarios that share one cluster: a dgx-h100 node with
// the seed's configuration and a pcie-8gpu node whose 1x seats overprovision
// its 4x groups.
func TestSeats(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{
		{Name: "node-a", Preset: "dgx-h100", Config: seedConfig},
		{Name: "node-b", Preset: "pcie-8gpu", Config: overprovisionConfig},
	}})
	installClasses(t, c)

	t.Run("one seat from a template", func(t *testing.T) {
		createTemplate(t, c, "one-1x", class1x)
		createPod(t, c, podSpec{name: "one", node: "node-a", claims: fromTemplate("one-1x")})
		pod, node, ctrs := c.WaitForPodRunning(t, "default", "one", timeout)
		claim := harness.PodClaim(pod, "gpu")
		if got := c.Allocation("default", claim); len(got) != 1 || got[0] != "node-a/g0-1x" {
			t.Fatalf("claim %s allocated %v, want node-a/g0-1x", claim, got)
		}
		app := ctrs["app"]
		// Ours, and the device metadata's (KEP-5304) that the kubelet
		// plugin helper writes.
		ours := slices.DeleteFunc(slices.Clone(app.CDIDevices), func(id string) bool { return !strings.HasPrefix(id, "kyb.ai/gpu=") })
		if len(ours) != 1 || len(app.CDIDevices) != 2 {
			t.Fatalf("the kubelet got CDI devices %v", app.CDIDevices)
		}
		want := map[string]string{
			"CUDA_VISIBLE_DEVICES": node.GPUUUID(0), "NVIDIA_VISIBLE_DEVICES": node.GPUUUID(0),
			"KYB_GPU_GROUP": "G0", "KYB_GPU_SEAT": "0", "KYB_SEAT_GEN": "1",
		}
		for k, v := range want {
			if app.Env[k] != v {
				t.Errorf("%s=%q, want %q", k, app.Env[k], v)
			}
		}
		if got := strings.Join(app.DeviceNodePaths(), " "); got != "/dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia0 /dev/nvidiactl" {
			t.Errorf("device nodes %s", got)
		}
		// The seat is visible in the claim's status, written behind the
		// prepare.
		cl := waitClaimStatus(t, c, "default", claim)
		if len(cl.Status.Devices) != 1 {
			t.Fatalf("claim status %+v", cl.Status.Devices)
		}
		var seat v1alpha1.SeatStatus
		if err := json.Unmarshal(cl.Status.Devices[0].Data.Raw, &seat); err != nil || seat.Group != "G0" || seat.Seats[0] != 0 {
			t.Errorf("seat status %+v %v", seat, err)
		}
		// The device's metadata file, mounted where KEP-5304 puts it.
		dev := containerMetadata(t, app, metadata.ResourceClaimTemplateFilePath("gpu.kyb.ai", "gpu", "gpu"))
		if dev.Name != "g0-1x" || *dev.Attributes["group"].StringValue != "G0" || !slices.Equal(dev.Attributes["seats"].IntValues, []int64{0}) ||
			!slices.Equal(dev.Attributes["seatGenerations"].IntValues, []int64{1}) || !slices.Equal(dev.Attributes["gpuUUIDs"].StringValues, []string{node.GPUUUID(0)}) {
			t.Errorf("device metadata %+v", dev)
		}
	})

	t.Run("one claim shared by two containers and two pods", func(t *testing.T) {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "default"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class2x}}}}}}
		if _, err := c.Client.ResourceV1().ResourceClaims("default").Create(c.Ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := "shared"
		ref := []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}}
		createPod(t, c, podSpec{name: "shared-1", containers: []string{"trainer", "sidecar"}, claims: ref})
		createPod(t, c, podSpec{name: "shared-2", claims: ref})
		_, n1, c1 := c.WaitForPodRunning(t, "default", "shared-1", timeout)
		_, n2, c2 := c.WaitForPodRunning(t, "default", "shared-2", timeout)
		if n1 != n2 {
			t.Fatalf("pods of one claim on %s and %s", n1.Name, n2.Name)
		}
		views := []*harness.Container{c1["trainer"], c1["sidecar"], c2["app"]}
		for _, v := range views[1:] {
			for _, k := range []string{"CUDA_VISIBLE_DEVICES", "KYB_GPU_GROUP", "KYB_GPU_SEAT", "KYB_SEAT_GEN"} {
				if v.Env[k] != views[0].Env[k] {
					t.Errorf("%s: %s=%q, the trainer has %q", v.Name, k, v.Env[k], views[0].Env[k])
				}
			}
		}
		if views[0].Env["KYB_GPU_GROUP"] == "" {
			t.Errorf("no seat env: %v", views[0].Env)
		}
	})

	t.Run("2x seat with a CEL selector and two seats with matchAttribute", func(t *testing.T) {
		createTemplate(t, c, "nvlink-2x", class2x, selector(`device.attributes["gpu.kyb.ai"].interconnect == "nvlink"`))
		createPod(t, c, podSpec{name: "nvlink", claims: fromTemplate("nvlink-2x")})
		pod, node, ctrs := c.WaitForPodRunning(t, "default", "nvlink", timeout)
		if node.Name != "node-a" {
			t.Errorf("an NVLink 2x seat ran on %s, which has no NVLink", node.Name)
		}
		if g := ctrs["app"].Env["KYB_GPU_GROUP"]; g != "G01" && g != "G23" && g != "G45" && g != "G67" {
			t.Errorf("group %s", g)
		}
		_ = pod
		// Two 1x seats of one claim on the same GPU group.
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "same-gpu", Namespace: "default"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{
					{Name: "a", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class1x}},
					{Name: "b", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class1x}},
				},
				Constraints: []resourceapi.DeviceConstraint{{Requests: []string{"a", "b"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.kyb.ai/group"))}},
			}}}
		if _, err := c.Client.ResourceV1().ResourceClaims("default").Create(c.Ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := "same-gpu"
		createPod(t, c, podSpec{name: "same-gpu", node: "node-a", claims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}}})
		_, _, ctrs = c.WaitForPodRunning(t, "default", "same-gpu", timeout)
		alloc := c.Allocation("default", "same-gpu")
		if len(alloc) != 2 || alloc[0] != alloc[1] {
			t.Errorf("matchAttribute on group: allocated %v, want two seats of one group", alloc)
		}
		// A claim with two requests names GPUs by index, as many as a
		// container taking both requests sees: here one.
		app := ctrs["app"]
		var gpus []string
		for _, p := range app.DeviceNodePaths() {
			if strings.TrimLeft(strings.TrimPrefix(p, "/dev/nvidia"), "0123456789") == "" {
				gpus = append(gpus, p)
			}
		}
		if len(gpus) != 1 || app.Env["CUDA_VISIBLE_DEVICES"] != "0" || app.Env["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" {
			t.Errorf("two seats of one GPU: GPU device nodes %v, env %v", gpus, app.Env)
		}
	})

	t.Run("legacy extended resource is served by DRA", func(t *testing.T) {
		createPod(t, c, podSpec{name: "legacy", node: "node-a", limits: v1.ResourceList{"kyb.ai/gpu-1x-seat": resource.MustParse("1")}})
		pod, _, ctrs := c.WaitForPodRunning(t, "default", "legacy", timeout)
		if pod.Status.ExtendedResourceClaimStatus == nil {
			t.Errorf("the scheduler made no extended-resource claim: %+v", pod.Status)
		}
		if env := ctrs["app"].Env; env["KYB_GPU_GROUP"] == "" || !strings.HasPrefix(env["CUDA_VISIBLE_DEVICES"], "GPU-") {
			t.Errorf("legacy pod env %v", env)
		}
	})

	t.Run("overlapping groups exclude each other without overprovisioning", func(t *testing.T) {
		// node-a: a 2x seat on G45 keeps GPU 4 from any 1x seat.
		createTemplate(t, c, "g45", class2x, selector(`device.attributes["gpu.kyb.ai"].group == "G45"`))
		createTemplate(t, c, "gpu4", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "4"`))
		createPod(t, c, podSpec{name: "g45", node: "node-a", claims: fromTemplate("g45")})
		c.WaitForPodRunning(t, "default", "g45", timeout)
		createPod(t, c, podSpec{name: "gpu4", node: "node-a", claims: fromTemplate("gpu4")})
		msg := c.WaitForPodUnschedulable(t, "default", "gpu4", timeout)
		if !strings.Contains(msg, "cannot allocate all claims") {
			t.Errorf("scheduler's reason: %q", msg)
		}
		c.DeletePod(t, "default", "g45")
		c.WaitForPodRunning(t, "default", "gpu4", timeout)
	})

	t.Run("overlapping groups share GPUs with overprovisioning", func(t *testing.T) {
		createTemplate(t, c, "b-4x", class4x, selector(`device.attributes["gpu.kyb.ai"].group == "G0123"`))
		createTemplate(t, c, "b-gpu0", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
		createPod(t, c, podSpec{name: "b-4x", node: "node-b", claims: fromTemplate("b-4x")})
		createPod(t, c, podSpec{name: "b-gpu0", node: "node-b", claims: fromTemplate("b-gpu0")})
		_, _, big := c.WaitForPodRunning(t, "default", "b-4x", timeout)
		_, _, small := c.WaitForPodRunning(t, "default", "b-gpu0", timeout)
		if !strings.Contains(big["app"].Env["CUDA_VISIBLE_DEVICES"], small["app"].Env["CUDA_VISIBLE_DEVICES"]) {
			t.Errorf("the overprovisioned 1x seat is not on a GPU of the 4x group: %s vs %s", small["app"].Env["CUDA_VISIBLE_DEVICES"], big["app"].Env["CUDA_VISIBLE_DEVICES"])
		}
	})

	t.Run("exhaustion, then a freed seat schedules the pending pod", func(t *testing.T) {
		// node-b has two 4x groups with one seat each; one is in use above.
		createTemplate(t, c, "any-4x", class4x)
		createPod(t, c, podSpec{name: "x4-1", node: "node-b", claims: fromTemplate("any-4x")})
		c.WaitForPodRunning(t, "default", "x4-1", timeout)
		createPod(t, c, podSpec{name: "x4-2", node: "node-b", claims: fromTemplate("any-4x")})
		msg := c.WaitForPodUnschedulable(t, "default", "x4-2", timeout)
		if !strings.Contains(msg, "cannot allocate all claims") {
			t.Errorf("scheduler's reason: %q", msg)
		}
		c.DeletePod(t, "default", "x4-1")
		_, _, ctrs := c.WaitForPodRunning(t, "default", "x4-2", timeout)
		if g := ctrs["app"].Env["KYB_GPU_GROUP"]; g != "G4567" {
			t.Errorf("freed group %s, want G4567", g)
		}
		if gen := ctrs["app"].Env["KYB_SEAT_GEN"]; gen != "2" {
			t.Errorf("the freed seat was handed out again with generation %s, want 2", gen)
		}
	})
}

// containerMetadata reads the metadata file mounted into a container at
// path and returns its one device.
func containerMetadata(t *testing.T, ctr *harness.Container, path string) metadatav1beta1.Device {
	t.Helper()
	for _, m := range ctr.Mounts {
		if m.Destination != path {
			continue
		}
		data, err := os.ReadFile(m.Source)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		for dec.More() {
			var md metadatav1beta1.DeviceMetadata
			if err := dec.Decode(&md); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if md.APIVersion == metadatav1beta1.SchemeGroupVersion.String() && len(md.Requests) == 1 && len(md.Requests[0].Devices) == 1 {
				return md.Requests[0].Devices[0]
			}
		}
		t.Fatalf("%s holds no %s object with one device: %s", path, metadatav1beta1.SchemeGroupVersion, data)
	}
	t.Fatalf("no mount at %s; mounts %+v", path, ctr.Mounts)
	return metadatav1beta1.Device{}
}
