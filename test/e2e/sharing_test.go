package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// mpsConfig shares one-GPU groups between four seats with MPS.
const mpsConfig = `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps}
- resource: kyb.ai/gpu-2x-seat
  sharing: {timeSlicing: {interval: Short}}
`

// MPS seats through the scheduler and the kubelet: two pods on GPU 0
// share its daemon, each held to a quarter of the GPU by the daemon
// whatever its environment says; a plugin restart keeps the daemon; the
// last pod's deletion stops it.
func TestMPSSeatsEndToEnd(t *testing.T) {
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{
		Name: "node-a", Preset: "dgx-h100", Config: mpsConfig,
		PluginArgs: []string{"--mps-root", root, "--mps-control", control},
	}}})
	installClasses(t, c)
	node := c.Node("node-a")
	createTemplate(t, c, "gpu0", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
	createPod(t, c, podSpec{name: "a", claims: fromTemplate("gpu0")})
	_, _, a := c.WaitForPodRunning(t, "default", "a", timeout)
	env := a["app"].Env
	// dgx-h100: 81559 MiB per GPU; a quarter, rounded down.
	for k, want := range map[string]string{
		"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20389M", "CUDA_VISIBLE_DEVICES": node.GPUUUID(0),
	} {
		if env[k] != want {
			t.Errorf("pod a: %s=%q, want %q", k, env[k], want)
		}
	}
	pipe := filepath.Join(root, "g0-1x", "pipe")
	mounts := map[string]string{}
	for _, m := range a["app"].Mounts {
		mounts[m.Destination] = m.Source
	}
	if mounts["/tmp/nvidia-mps"] != pipe || mounts["/dev/shm"] != filepath.Join(root, "g0-1x", "shm") {
		t.Errorf("pod a's mounts %v: want the daemon's pipe directory and its shm as /dev/shm", mounts)
	}
	if got := mpstest.Join(t, control, pipe, "100", "0=80G"); got != "thread=25 mem=0=20389M" {
		t.Errorf("a client raising its limits got %q from the daemon, want a quarter", got)
	}

	node.StopPlugin()
	node.StartPlugin()
	node.WaitForPlugin()
	createPod(t, c, podSpec{name: "b", claims: fromTemplate("gpu0")})
	_, _, b := c.WaitForPodRunning(t, "default", "b", timeout)
	if b["app"].Env["KYB_GPU_SEAT"] != "1" || b["app"].Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" {
		t.Errorf("pod b: seat %s, thread %s", b["app"].Env["KYB_GPU_SEAT"], b["app"].Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
	}
	log, err := os.ReadFile(filepath.Join(root, "g0-1x", "log", "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "Control daemon started"); n != 1 {
		t.Errorf("the daemon started %d times across the plugin's restart, want once", n)
	}

	c.DeletePod(t, "default", "a")
	c.DeletePod(t, "default", "b")
	err = wait.PollUntilContextTimeout(c.Ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(root, "g0-1x"))
		return os.IsNotExist(err), nil
	})
	if err != nil {
		t.Errorf("the daemon of GPU 0 is still there after its last pod went: %v", err)
	}
}
