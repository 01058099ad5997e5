package e2enode

import (
	"bytes"
	"encoding/json"
	"maps"
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
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

const (
	class1x = "gpu-1x-seat.kyb.ai"
	class2x = "gpu-2x-seat.kyb.ai"
)

// nodeConfig: 1x seats four to a GPU, 2x seats three to an NVLink pair.
const nodeConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
groups: [{name: G01, gpus: [0, 1]}, {name: G23, gpus: [2, 3]}]
`

func startCluster(t *testing.T) *harness.Cluster {
	t.Helper()
	// The API server reaches a kubelet at its address, not its name: node
	// names do not resolve here.
	c := harness.Start(t, harness.Options{APIServerFlags: []string{"--kubelet-preferred-address-types=InternalIP"}})
	if _, err := c.ApplyFile(filepath.Join(repoRoot(), "deployments/static/deviceclasses.yaml"), harness.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// startNode starts a real node with a stand-in NVIDIA driver root of
// driver 580.95.05 (CUDA API 13000): containers get its libcuda.so.1.
func startNode(t *testing.T, c *harness.Cluster, opts realnode.Options) (*realnode.Node, *realnode.FakeDriver) {
	t.Helper()
	driver, err := realnode.NewFakeDriver(t.TempDir(), opts.Name, opts.Preset)
	if err != nil {
		t.Fatal(err)
	}
	if err := driver.Install(c.Ctx, "580.95.05", 13000); err != nil {
		t.Fatal(err)
	}
	opts.DriverRoot = driver.Root
	return realnode.Start(t, c, tools, opts), driver
}

// on selects a group by its GPUs ("0", "0,1") in a claim template.
func on(t *testing.T, c *harness.Cluster, name, class, gpus string) {
	t.Helper()
	claimTemplate(t, c, name, class, 1, `device.attributes["gpu.kyb.ai"].gpuIndices == "`+gpus+`"`)
}

// metadataUUIDs reads the GPU UUIDs of a container's device metadata
// files, in file order: what the plugin says the claim got.
func metadataUUIDs(t *testing.T, o output) []string {
	t.Helper()
	var uuids []string
	for _, attrs := range metadataAttributes(t, o) {
		uuids = append(uuids, attrs["gpuUUIDs"].StringValues...)
	}
	return uuids
}

// metadataAttributes reads the attributes of each device in a container's
// device metadata files, in file order.
func metadataAttributes(t *testing.T, o output) []map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	var out []map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	files := slices.Sorted(maps.Keys(o.metadata))
	for _, f := range files {
		dec := json.NewDecoder(bytes.NewReader([]byte(o.metadata[f])))
		for dec.More() {
			var md metadatav1beta1.DeviceMetadata
			if err := dec.Decode(&md); err != nil {
				t.Fatalf("metadata %s: %v", f, err)
			}
			if md.APIVersion != metadatav1beta1.SchemeGroupVersion.String() {
				continue
			}
			for _, r := range md.Requests {
				for _, d := range r.Devices {
					out = append(out, d.Attributes)
				}
			}
		}
	}
	return out
}

// cdiDevices returns the CDI device names of a pod's claim, read from
// the claim's spec on the node (the names the kubelet passes on).
func cdiDevices(t *testing.T, c *harness.Cluster, n *realnode.Node, pod, entry string) []string {
	t.Helper()
	p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := c.Client.ResourceV1().ResourceClaims("default").Get(c.Ctx, harness.PodClaim(p, entry), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(n.CDIDir, cdi.SpecName(claim.UID)+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Kind    string `json:"kind"`
		Devices []struct {
			Name string `json:"name"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range spec.Devices {
		ids = append(ids, spec.Kind+"="+d.Name)
	}
	return ids
}

// specFiles lists the claims' CDI spec files on the node (the plugin's;
// the kubelet's device metadata specs lie beside them).
func specFiles(t *testing.T, n *realnode.Node) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(n.CDIDir, cdi.SpecName("*")+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRealPods runs real containers with the driver's seats on a real
// node and checks, from what each container printed, what it got.
func TestRealPods(t *testing.T) {
	c := startCluster(t)
	n, driver := startNode(t, c, realnode.Options{Name: "node-a", Preset: "dgx-h100", Config: nodeConfig})

	var gpu0 string
	t.Run("a 1x seat", func(t *testing.T) {
		on(t, c, "gpu0", class1x, "0")
		createPod(t, c, podSpec{name: "one", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu0")}})
		o := waitForOutput(t, c, "one", "app")
		t.Logf("pod one's container printed:\n%s", o.raw)
		uuids := metadataUUIDs(t, o)
		if len(uuids) != 1 || !strings.HasPrefix(uuids[0], "GPU-") {
			t.Fatalf("device metadata names GPUs %v, want one", uuids)
		}
		gpu0 = uuids[0]
		want := map[string]string{"CUDA_VISIBLE_DEVICES": gpu0, "KYB_GPU_GROUP": "G0", "KYB_GPU_SEAT": "0", "KYB_SEAT_GEN": "1"}
		for k, v := range want {
			if o.env[k] != v {
				t.Errorf("%s=%q, want %q", k, o.env[k], v)
			}
		}
		for _, d := range []string{"nvidia0", "nvidiactl", "nvidia-uvm"} {
			if !o.device(d) {
				t.Errorf("no /dev/%s in the container: %v", d, o.devices)
			}
		}
		if o.device("nvidia1") {
			t.Errorf("the container has another GPU's device node: %v", o.devices)
		}
		if !o.mountedUnder("/var/run/kubernetes.io/dra-device-attributes") {
			t.Errorf("no device metadata mounted: %v", o.mounts)
		}
		if len(o.metadata) != 1 {
			t.Errorf("device metadata files %v, want one", slices.Sorted(maps.Keys(o.metadata)))
		}
		// A plain image (no LD_LIBRARY_PATH, no loader cache) finds the
		// driver's libcuda.so.1 where the spec mounts it.
		r, sees := o.cudaSees(t)
		if r.Library != "/usr/lib/x86_64-linux-gnu/libcuda.so.1" || r.DriverVersion != 13000 || !slices.Equal(sees, []string{gpu0}) {
			t.Errorf("CUDA loaded %q (API %d) and sees %v, want libcuda.so.1 of the driver root (13000) seeing %s: %s", r.Library, r.DriverVersion, sees, gpu0, o.cuda)
		}
	})

	t.Run("a shared claim in two pods", func(t *testing.T) {
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "default"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class1x, Count: 1,
					Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.kyb.ai"].gpuIndices == "5"`}}}},
			}}}},
		}
		if _, err := c.Client.ResourceV1().ResourceClaims("default").Create(c.Ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		createPod(t, c, podSpec{name: "shared-1", node: n.Name, claims: []v1.PodResourceClaim{byName("gpu", "shared")}})
		createPod(t, c, podSpec{name: "shared-2", node: n.Name, claims: []v1.PodResourceClaim{byName("gpu", "shared")}})
		a, b := waitForOutput(t, c, "shared-1", "app"), waitForOutput(t, c, "shared-2", "app")
		for _, k := range []string{"CUDA_VISIBLE_DEVICES", "KYB_GPU_GROUP", "KYB_GPU_SEAT", "KYB_SEAT_GEN"} {
			if a.env[k] == "" || a.env[k] != b.env[k] {
				t.Errorf("%s: %q and %q, want one seat for both pods", k, a.env[k], b.env[k])
			}
		}
		if a.env["KYB_GPU_GROUP"] != "G5" || !a.device("nvidia5") || !b.device("nvidia5") {
			t.Errorf("shared seat on %s, devices %v and %v; want G5 with /dev/nvidia5", a.env["KYB_GPU_GROUP"], a.devices, b.devices)
		}
	})

	t.Run("a 2x NVLink seat", func(t *testing.T) {
		claimTemplate(t, c, "pair", class2x, 1, `device.attributes["gpu.kyb.ai"].group == "G23"`)
		createPod(t, c, podSpec{name: "pair", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "pair")}})
		o := waitForOutput(t, c, "pair", "app")
		uuids := metadataUUIDs(t, o)
		if len(uuids) != 2 || o.env["CUDA_VISIBLE_DEVICES"] != strings.Join(uuids, ",") {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q, metadata GPUs %v: want the pair's two UUIDs", o.env["CUDA_VISIBLE_DEVICES"], uuids)
		}
		if o.env["KYB_GPU_GROUP"] != "G23" || !o.device("nvidia2") || !o.device("nvidia3") || o.device("nvidia0") {
			t.Errorf("group %s, devices %v: want G23 with /dev/nvidia2 and /dev/nvidia3 only", o.env["KYB_GPU_GROUP"], o.devices)
		}
	})

	t.Run("two claims in one container", func(t *testing.T) {
		on(t, c, "gpu1", class1x, "1")
		on(t, c, "gpu4", class1x, "4")
		createPod(t, c, podSpec{name: "two", node: n.Name,
			claims:     []v1.PodResourceClaim{fromTemplate("a", "gpu1"), fromTemplate("b", "gpu4")},
			containers: map[string][]string{"both": {"a", "b"}, "solo": {"a"}}})
		both, solo := waitForOutput(t, c, "two", "both"), waitForOutput(t, c, "two", "solo")
		t.Logf("pod two's container both printed:\n%s", both.raw)
		held := metadataUUIDs(t, both)
		slices.Sort(held)
		if _, sees := both.cudaSees(t); len(held) != 2 || !slices.Equal(sees, held) {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q: CUDA sees %v, want both claims' GPUs %v", both.env["CUDA_VISIBLE_DEVICES"], sees, held)
		}
		if !both.device("nvidia1") || !both.device("nvidia4") {
			t.Errorf("devices %v, want /dev/nvidia1 and /dev/nvidia4", both.devices)
		}
		if _, sees := solo.cudaSees(t); !slices.Equal(sees, metadataUUIDs(t, solo)) || len(sees) != 1 || solo.device("nvidia4") {
			t.Errorf("the container with one of the claims: CUDA sees %v, devices %v", sees, solo.devices)
		}
	})

	t.Run("a standalone claim prepared before, beside the pod's own in one container", func(t *testing.T) {
		// The kubelet prepares only the pod's own claim: the shared one
		// was prepared for shared-1.
		createPod(t, c, podSpec{name: "shared-3", node: n.Name,
			claims:     []v1.PodResourceClaim{byName("s", "shared"), fromTemplate("own", "gpu4")},
			containers: map[string][]string{"app": {"s", "own"}}})
		o := waitForOutput(t, c, "shared-3", "app")
		held := metadataUUIDs(t, o)
		slices.Sort(held)
		if _, sees := o.cudaSees(t); len(held) != 2 || !slices.Equal(sees, held) {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q: CUDA sees %v, want both claims' GPUs %v", o.env["CUDA_VISIBLE_DEVICES"], sees, held)
		}
	})

	t.Run("podman consumes the same spec", func(t *testing.T) {
		// The pair's claim, as the kubelet handed it to containerd, given
		// to a second runtime by its CDI name.
		ids := cdiDevices(t, c, n, "pair", "gpu")
		got := parseOutput(n.Podman(t, ids, probeReport))
		viaKubelet := waitForOutput(t, c, "pair", "app")
		for _, k := range []string{"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "KYB_GPU_GROUP", "KYB_GPU_SEAT", "KYB_SEAT_GEN"} {
			if got.env[k] == "" || got.env[k] != viaKubelet.env[k] {
				t.Errorf("podman: %s=%q, containerd: %q", k, got.env[k], viaKubelet.env[k])
			}
		}
		if !got.device("nvidia2") || !got.device("nvidia3") || !got.device("nvidiactl") || got.device("nvidia0") {
			t.Errorf("podman's container has device nodes %v, want the pair's", got.devices)
		}
	})

	t.Run("a legacy pod asking for an extended resource", func(t *testing.T) {
		createPod(t, c, podSpec{name: "legacy", node: n.Name, limits: v1.ResourceList{"kyb.ai/gpu-1x-seat": resource.MustParse("1")}})
		o := waitForOutput(t, c, "legacy", "app")
		pod, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, "legacy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Status.ExtendedResourceClaimStatus == nil {
			t.Errorf("the scheduler made no claim for the extended resource: %+v", pod.Status)
		}
		if !strings.HasPrefix(o.env["CUDA_VISIBLE_DEVICES"], "GPU-") || o.env["KYB_GPU_SEAT"] == "" {
			t.Errorf("legacy pod's environment has no seat: %v", o.env)
		}
	})

	t.Run("a seat handed out again, after its pod is deleted", func(t *testing.T) {
		before := len(specFiles(t, n))
		deletePod(t, c, "one")
		// The pod is gone once the kubelet has unprepared its claim; the
		// claim controller then deletes the claim made from the template.
		waitUntil(t, "pod one's CDI spec removed", 30*time.Second, func() bool { return len(specFiles(t, n)) == before-1 })
		createPod(t, c, podSpec{name: "again", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu0")}})
		o := waitForOutput(t, c, "again", "app")
		if o.env["KYB_GPU_GROUP"] != "G0" || o.env["KYB_GPU_SEAT"] != "0" || o.env["KYB_SEAT_GEN"] != "2" || o.env["CUDA_VISIBLE_DEVICES"] != gpu0 {
			t.Errorf("seat 0 of G0 handed out again as %s seat %s generation %s on %s, want G0 seat 0 generation 2 on %s",
				o.env["KYB_GPU_GROUP"], o.env["KYB_GPU_SEAT"], o.env["KYB_SEAT_GEN"], o.env["CUDA_VISIBLE_DEVICES"], gpu0)
		}
	})

	t.Run("the driver upgraded under the running plugin", func(t *testing.T) {
		if err := driver.Install(c.Ctx, "590.10.01", 13010); err != nil {
			t.Fatal(err)
		}
		createPod(t, c, podSpec{name: "upgraded", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu4")}})
		o := waitForOutput(t, c, "upgraded", "app")
		if r, sees := o.cudaSees(t); r.DriverVersion != 13010 || len(sees) != 1 {
			t.Errorf("after the upgrade CUDA loaded %q (API %d) and sees %v, want the new driver's (13010): %s", r.Library, r.DriverVersion, sees, o.cuda)
		}
	})

	t.Run("the plugin restarted under running pods", func(t *testing.T) {
		n.StopPlugin()
		n.StartPlugin(t)
		// A pod prepared by the new plugin, and one of the old plugin's
		// released by it.
		on(t, c, "gpu6", class1x, "6")
		createPod(t, c, podSpec{name: "after-plugin", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu6")}})
		o := waitForOutput(t, c, "after-plugin", "app")
		if o.env["KYB_GPU_GROUP"] != "G6" || !o.device("nvidia6") {
			t.Errorf("after the plugin's restart: group %s, devices %v", o.env["KYB_GPU_GROUP"], o.devices)
		}
		before := len(specFiles(t, n))
		deletePod(t, c, "pair")
		waitUntil(t, "pod pair's CDI spec removed by the restarted plugin", 30*time.Second, func() bool { return len(specFiles(t, n)) == before-1 })
		assertRunning(t, c, "again", "shared-1", "shared-2", "shared-3", "legacy", "two", "upgraded")
	})

	t.Run("the kubelet restarted under running pods", func(t *testing.T) {
		n.RestartKubelet(t)
		on(t, c, "gpu7", class1x, "7")
		createPod(t, c, podSpec{name: "after-kubelet", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu7")}})
		o := waitForOutput(t, c, "after-kubelet", "app")
		if o.env["KYB_GPU_GROUP"] != "G7" || !o.device("nvidia7") {
			t.Errorf("after the kubelet's restart: group %s, devices %v", o.env["KYB_GPU_GROUP"], o.devices)
		}
		assertRunning(t, c, "again", "shared-1", "shared-2", "legacy", "after-plugin")
	})
}

// assertRunning checks that pods still run their first container: a
// restart of the plugin or the kubelet must not stop them.
func assertRunning(t *testing.T, c *harness.Cluster, pods ...string) {
	t.Helper()
	for _, name := range pods {
		p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s: %v", name, err)
			continue
		}
		if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			t.Errorf("pod %s no longer runs its container: %s", name, describe(c, name))
		}
	}
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
