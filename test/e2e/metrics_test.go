package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

const consumableConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
`

// series is one sample of a scrape: its labels and value.
type series struct {
	labels map[string]string
	value  float64
}

// scrape reads the families named from a /metrics endpoint.
func scrape(t *testing.T, url string, names ...string) map[string][]series {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]series{}
	for _, line := range strings.Split(string(body), "\n") {
		for _, name := range names {
			rest, ok := strings.CutPrefix(line, name+"{")
			if !ok {
				continue
			}
			labelText, valueText, ok := strings.Cut(rest, "} ")
			if !ok {
				t.Fatalf("unparsable line %q", line)
			}
			s := series{labels: map[string]string{}}
			for _, kv := range strings.Split(labelText, ",") {
				k, v, _ := strings.Cut(kv, "=")
				s.labels[k] = strings.Trim(v, `"`)
			}
			if s.value, err = strconv.ParseFloat(valueText, 64); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			out[name] = append(out[name], s)
		}
	}
	return out
}

// Per-pod GPU metrics through the scheduler, the kubelet and the plugin's
// real /metrics endpoint: each pod's simulated workload on its seat shows
// under its namespace, pod, container, group and seat, for claims from a
// template and for a legacy pod's extended resources alike, and goes
// with the pod.
func TestPerPodGPUMetricsEndToEnd(t *testing.T) {
	use := map[string][2]uint64{"a": {10000, 40}, "b": {6000, 15}, "legacy": {3000, 5}}
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{
		Name: "node-a", Preset: "dgx-h100", Config: consumableConfig, Metrics: true,
		GPUUse: func(pod *v1.Pod, container string) (uint64, uint32, bool) {
			u, ok := use[pod.Name]
			return u[0], uint32(u[1]), ok
		},
	}}})
	installClasses(t, c)
	node := c.Node("node-a")
	createTemplate(t, c, "gpu0", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
	createPod(t, c, podSpec{name: "a", claims: fromTemplate("gpu0")})
	createPod(t, c, podSpec{name: "b", claims: fromTemplate("gpu0")})
	createPod(t, c, podSpec{name: "legacy", limits: v1.ResourceList{"kyb.ai/gpu-1x-seat": resource.MustParse("1")}})
	want := map[string]map[string]string{}
	for _, name := range []string{"a", "b", "legacy"} {
		_, _, ctrs := c.WaitForPodRunning(t, "default", name, timeout)
		env := ctrs["app"].Env
		gpu := ""
		for i := range 8 {
			if node.GPUUUID(i) == env["CUDA_VISIBLE_DEVICES"] {
				gpu = strconv.Itoa(i)
			}
		}
		want[name] = map[string]string{"namespace": "default", "pod": name, "container": "app", "group": env["KYB_GPU_GROUP"], "seat": env["KYB_GPU_SEAT"], "gpu": gpu}
	}
	if want["a"]["gpu"] != "0" || want["b"]["gpu"] != "0" || want["a"]["seat"] == want["b"]["seat"] {
		t.Fatalf("pods a and b got %v and %v; want two seats of GPU 0", want["a"], want["b"])
	}

	const mib = 1 << 20
	find := func(all []series, labels map[string]string) (float64, bool) {
		for _, s := range all {
			match := true
			for k, v := range labels {
				match = match && s.labels[k] == v
			}
			if match {
				return s.value, true
			}
		}
		return 0, false
	}
	names := []string{"kyb_container_gpu_memory_used_bytes", "kyb_container_gpu_sm_utilization_ratio", "kyb_gpu_memory_used_bytes", "kyb_gpu_unattributed_memory_used_bytes"}
	var got map[string][]series
	err := wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		got = scrape(t, node.MetricsURL, names...)
		for _, l := range want {
			if _, ok := find(got["kyb_container_gpu_memory_used_bytes"], l); !ok {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("per-pod series never all appeared: %+v; unattributed %+v", got["kyb_container_gpu_memory_used_bytes"], got["kyb_gpu_unattributed_memory_used_bytes"])
	}
	for name, l := range want {
		mem, _ := find(got["kyb_container_gpu_memory_used_bytes"], l)
		sm, _ := find(got["kyb_container_gpu_sm_utilization_ratio"], l)
		if mem != float64(use[name][0]*mib) || sm != float64(use[name][1])/100 {
			t.Errorf("pod %s %v: memory %v, SM %v; want %v, %v", name, l, mem, sm, use[name][0]*mib, float64(use[name][1])/100)
		}
	}
	var onGPU0 uint64
	for name, l := range want {
		if l["gpu"] == "0" {
			onGPU0 += use[name][0] * mib
		}
	}
	if v, _ := find(got["kyb_gpu_memory_used_bytes"], map[string]string{"gpu": "0"}); v != float64(onGPU0) {
		t.Errorf("GPU 0 memory used %v, want its pods' %v", v, onGPU0)
	}
	for _, s := range got["kyb_gpu_unattributed_memory_used_bytes"] {
		if s.value != 0 {
			t.Errorf("unattributed GPU memory %v: %v", s.labels, s.value)
		}
	}

	c.DeletePod(t, "default", "a")
	err = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		got = scrape(t, node.MetricsURL, names...)
		_, stillA := find(got["kyb_container_gpu_memory_used_bytes"], want["a"])
		_, b := find(got["kyb_container_gpu_memory_used_bytes"], want["b"])
		return !stillA && b, nil
	})
	if err != nil {
		t.Errorf("after pod a went: %v", fmt.Sprint(got["kyb_container_gpu_memory_used_bytes"]))
	}
}

// A container that references one request of a claim with two is counted
// on that request's seat alone: two containers of one pod, each using one
// of two seats of GPU 1 through its own request of one claim. The plugin
// reads the requests from the containers' device metadata mounts.
func TestPerPodGPUMetricsCountTheRequestAContainerUses(t *testing.T) {
	use := map[string][2]uint64{"a": {1000, 10}, "b": {2000, 20}}
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{
		Name: "node-a", Preset: "dgx-h100", Config: consumableConfig, Metrics: true,
		GPUUse: func(pod *v1.Pod, container string) (uint64, uint32, bool) {
			u, ok := use[container]
			return u[0], uint32(u[1]), ok && pod.Name == "split"
		},
	}}})
	installClasses(t, c)
	node := c.Node("node-a")
	on1 := []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.kyb.ai"].gpuIndices == "1"`}}}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "split"}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{
			{Name: "for-a", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class1x, Selectors: on1}},
			{Name: "for-b", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class1x, Selectors: on1}},
		},
	}}}
	if _, err := c.Client.ResourceV1().ResourceClaims("default").Create(c.Ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "split", Namespace: "default"}, Spec: v1.PodSpec{
		ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
		Containers: []v1.Container{
			{Name: "a", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu", Request: "for-a"}}}},
			{Name: "b", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu", Request: "for-b"}}}},
		},
	}}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, ctrs := c.WaitForPodRunning(t, "default", "split", timeout)
	seatA, seatB := ctrs["a"].Env["KYB_GPU_SEAT"], ctrs["b"].Env["KYB_GPU_SEAT"]
	if seatA == "" || seatB == "" || seatA == seatB || ctrs["a"].Env["KYB_GPU_GROUP"] != "G1" || ctrs["b"].Env["KYB_GPU_GROUP"] != "G1" {
		t.Fatalf("containers a and b: %v and %v; want one seat each of G1", ctrs["a"].Env, ctrs["b"].Env)
	}
	const mib = 1 << 20
	want := map[string]map[string]string{
		"a": {"pod": "split", "container": "a", "group": "G1", "seat": seatA, "gpu": "1"},
		"b": {"pod": "split", "container": "b", "group": "G1", "seat": seatB, "gpu": "1"},
	}
	var got []series
	err := wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		got = scrape(t, node.MetricsURL, "kyb_container_gpu_memory_used_bytes")["kyb_container_gpu_memory_used_bytes"]
		found := 0
		for name, labels := range want {
			for _, s := range got {
				match := s.value == float64(use[name][0]*mib)
				for k, v := range labels {
					match = match && s.labels[k] == v
				}
				if match {
					found++
				}
			}
		}
		return found == len(want) && len(got) == len(want), nil
	})
	if err != nil {
		t.Errorf("series %+v; want one per container, on its own request's seat: %v", got, want)
	}
}
