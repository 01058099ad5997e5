package e2enode

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// The device-plugin shim through the chart on a real node: its pod
// registers each profile's extended resource with the kubelet's device
// manager through the chart's host path, which the kubelet keeps in
// /var/lib/kubelet/device-plugins whatever its root directory (this
// node's is elsewhere); a legacy pod runs with its seat.
func TestHelmShim(t *testing.T) {
	h := startHelmNode(t, realnode.Options{Name: "helm-shim", Preset: "dgx-h100"})
	c, n := h.c, h.n
	h.install(t, "install", []string{example("simulated-values.yaml"), example("device-plugin-values.yaml")})
	pod := h.waitForAgent(t, 3*time.Minute)
	t.Logf("the shim's pod:\n%s", podTable(h.pods(t)))
	if pod.Spec.Containers[0].Command[0] != "/usr/local/bin/kyb-device-plugin" {
		t.Errorf("the DaemonSet runs %v, want the shim", pod.Spec.Containers[0].Command)
	}
	n.WaitForResources(t, "kyb.ai/gpu-1x-seat", "kyb.ai/gpu-2x-seat")
	sockets, _ := filepath.Glob(filepath.Join(realnode.KubeletDevicePluginDir, "kyb-*.sock"))
	t.Logf("node %s offers %s; the shim's sockets: %v", n.Name, n.Resources(t), sockets)
	if len(sockets) != 2 {
		t.Errorf("the shim's sockets in %s: %v, want one per profile", realnode.KubeletDevicePluginDir, sockets)
	}

	createPod(t, c, podSpec{name: "legacy", node: n.Name, limits: v1.ResourceList{"kyb.ai/gpu-2x-seat": resource.MustParse("1")}})
	o := waitForOutput(t, c, "legacy", "app")
	t.Logf("pod legacy's container, its seat from the shim in a pod:\n%s", strings.Join(strings.SplitAfter(o.raw, "--- mounts")[:1], ""))
	uuids := strings.Split(o.env["CUDA_VISIBLE_DEVICES"], ",")
	if len(uuids) != 2 || !strings.HasPrefix(uuids[0], "GPU-") || o.env["KYB_GPU_SEAT"] == "" || !strings.HasPrefix(o.env["KYB_GPU_GROUP"], "G") {
		t.Errorf("pod legacy's environment has no 2x seat: %v", o.env)
	}
	var gpus int
	for _, d := range o.devices {
		f := strings.Fields(d)
		if last := f[len(f)-1]; strings.TrimLeft(strings.TrimPrefix(last, "/dev/nvidia"), "0123456789") == "" {
			gpus++
		}
	}
	if gpus != 2 || !o.device("nvidiactl") {
		t.Errorf("pod legacy's device nodes %v, want its group's two GPUs and nvidiactl", o.devices)
	}
	deletePod(t, c, "legacy")
	h.run(t, "uninstall", helmRelease, "--namespace", helmNamespace, "--wait")
}
