package e2enode

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// legacyPod runs the probe in a pod asking for count seats of an extended
// resource, and returns what its container printed.
func legacyPod(t *testing.T, c *harness.Cluster, n *realnode.Node, name, res string, count int64) output {
	t.Helper()
	createPod(t, c, podSpec{name: name, node: n.Name, limits: v1.ResourceList{v1.ResourceName(res): *resource.NewQuantity(count, resource.DecimalSI)}})
	return waitForOutput(t, c, name, "app")
}

// seesItsSeats checks a container's seats: groups and seats listed once
// per seat, the device nodes of one group's gpus GPUs and no other, and
// CUDA seeing exactly those.
func seesItsSeats(t *testing.T, name string, o output, seats, gpus int) {
	t.Helper()
	groups := strings.Split(o.env["KYB_GPU_GROUP"], ",")
	if len(groups) != seats || len(strings.Split(o.env["KYB_GPU_SEAT"], ",")) != seats || len(strings.Split(o.env["KYB_SEAT_GEN"], ",")) != seats {
		t.Errorf("%s: KYB_GPU_GROUP=%q KYB_GPU_SEAT=%q KYB_SEAT_GEN=%q, want %d seats", name, o.env["KYB_GPU_GROUP"], o.env["KYB_GPU_SEAT"], o.env["KYB_SEAT_GEN"], seats)
	}
	if len(slices.Compact(slices.Clone(groups))) != 1 {
		t.Errorf("%s: seats on groups %v, want one group", name, groups)
	}
	var nodes int
	for _, d := range o.devices {
		f := strings.Fields(d)
		if last := f[len(f)-1]; strings.TrimLeft(strings.TrimPrefix(last, "/dev/nvidia"), "0123456789") == "" {
			nodes++
		}
	}
	if nodes != gpus || !o.device("nvidiactl") {
		t.Errorf("%s: device nodes %v, want %d GPUs' and nvidiactl", name, o.devices, gpus)
	}
	r, sees := o.cudaSees(t)
	if len(sees) != gpus || r.Library != "/usr/lib/x86_64-linux-gnu/libcuda.so.1" {
		t.Errorf("%s: CUDA loaded %q and sees %v, want %d GPUs: %s", name, r.Library, sees, gpus, o.cuda)
	}
	if uuids := strings.Split(o.env["CUDA_VISIBLE_DEVICES"], ","); !slices.Equal(slices.Sorted(slices.Values(uuids)), sees) {
		t.Errorf("%s: CUDA_VISIBLE_DEVICES=%q, CUDA sees %v", name, o.env["CUDA_VISIBLE_DEVICES"], sees)
	}
}

// The device-plugin shim on a real kubelet: the kubelet's own device
// manager registers its resources, asks it where to put several seats and
// hands containers what Allocate answers (env injection) or the CDI
// devices it names (CDI injection).
func TestShimOnARealKubelet(t *testing.T) {
	c := startCluster(t)
	n, _ := startNode(t, c, realnode.Options{Name: "node-s", Preset: "dgx-h100", Config: nodeConfig, Shim: true,
		PluginArgs: []string{"--injection", "envvar"}})
	// nodeConfig has 1x and 2x profiles.
	served := []v1.ResourceName{"kyb.ai/gpu-1x-seat", "kyb.ai/gpu-2x-seat"}
	n.WaitForResources(t, served...)
	t.Logf("node %s offers %s", n.Name, n.Resources(t))

	t.Run("1x and 2x seats through the environment", func(t *testing.T) {
		seesItsSeats(t, "legacy-1x", legacyPod(t, c, n, "legacy-1x", "kyb.ai/gpu-1x-seat", 1), 1, 1)
		o := legacyPod(t, c, n, "legacy-2x", "kyb.ai/gpu-2x-seat", 1)
		t.Logf("pod legacy-2x's container printed:\n%s", o.raw)
		seesItsSeats(t, "legacy-2x", o, 1, 2)
	})

	t.Run("several seats of one resource on one group", func(t *testing.T) {
		// The kubelet asks the shim's GetPreferredAllocation.
		seesItsSeats(t, "legacy-3", legacyPod(t, c, n, "legacy-3", "kyb.ai/gpu-1x-seat", 3), 3, 1)
	})

	t.Run("the shim restarted with CDI injection", func(t *testing.T) {
		n.StopPlugin()
		n.Options.PluginArgs = []string{"--injection", "cdi"}
		registered := n.ShimRegistrations()
		n.StartPlugin(t)
		// Until the shim has registered again, the kubelet refuses pods
		// asking for its resources (UnexpectedAdmissionError: no healthy
		// devices), as with any device plugin.
		n.WaitForRegistrations(t, registered, len(served))
		before := len(specFiles(t, n))
		o := legacyPod(t, c, n, "legacy-cdi", "kyb.ai/gpu-2x-seat", 1)
		seesItsSeats(t, "legacy-cdi", o, 1, 2)
		if after := len(specFiles(t, n)); after != before+1 {
			t.Errorf("CDI specs %d before the pod, %d after: want the container's", before, after)
		}
		assertRunning(t, c, "legacy-1x", "legacy-2x", "legacy-3")
	})

	t.Run("the kubelet restarted", func(t *testing.T) {
		registered := n.ShimRegistrations()
		n.RestartKubelet(t)
		// The kubelet removes the plugins' sockets when it starts; the shim
		// registers every resource again.
		n.WaitForRegistrations(t, registered, len(served))
		seesItsSeats(t, "after-kubelet", legacyPod(t, c, n, "after-kubelet", "kyb.ai/gpu-1x-seat", 1), 1, 1)
		assertRunning(t, c, "legacy-1x", "legacy-2x", "legacy-3", "legacy-cdi")
	})
}
