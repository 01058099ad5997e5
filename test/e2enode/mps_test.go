package e2enode

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// mpsConfig shares each GPU of the 1x profile between four seats with MPS.
const mpsConfig = `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps}
`

// mpsClientCommand joins the daemon from inside the container asking for
// the whole GPU, and prints what it got as MPS_CLIENT.
const mpsClientCommand = `echo "MPS_CLIENT=$(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G nvidia-cuda-mps-control --client 2>&1)"; `

// isMPSClient checks a container's MPS environment and mounts, and that
// the daemon gave its client the share (thread per cent, memory limits)
// whatever the client asked for.
func isMPSClient(t *testing.T, o output, thread, mem string) {
	t.Helper()
	for k, want := range map[string]string{
		"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": thread, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": mem,
		"MPS_CLIENT": "thread=" + thread + " mem=" + mem,
	} {
		if o.env[k] != want {
			t.Errorf("%s=%q, want %q", k, o.env[k], want)
		}
	}
	if !o.mountedAt("/tmp/nvidia-mps") || !o.mountedAt("/dev/shm") {
		t.Errorf("the daemon's pipe directory and shm are not mounted: %v", o.mounts)
	}
}

// An MPS seat in a real container: the client's limits in its
// environment, the daemon's pipe directory mounted where
// CUDA_MPS_PIPE_DIRECTORY says and its shm as /dev/shm; a client in the
// container that asks the daemon for the whole GPU gets its quarter; the
// daemon goes with the last pod. The daemon is the simulated
// nvidia-cuda-mps-control (package mpstest), which keeps the limits it is
// told as MPS does; the image carries its client side.
func TestMPSOnARealNode(t *testing.T) {
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	c := startCluster(t)
	n, _ := startNode(t, c, realnode.Options{Name: "node-m", Preset: "dgx-h100", Config: mpsConfig,
		PluginArgs: []string{"--mps-root", root, "--mps-control", control},
		ImageFiles: map[string]string{"bin/nvidia-cuda-mps-control": control}})

	on(t, c, "mps0", class1x, "0")
	createPod(t, c, podSpec{name: "mps", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "mps0")},
		command: mpsClientCommand + probe})
	o := waitForOutput(t, c, "mps", "app")
	t.Logf("pod mps's container printed:\n%s", o.raw)
	// dgx-h100: 81559 MiB per GPU; a quarter, rounded down.
	isMPSClient(t, o, "25", "0=20389M")
	if _, sees := o.cudaSees(t); len(sees) != 1 || !slices.Equal(sees, metadataUUIDs(t, o)) {
		t.Errorf("CUDA sees %v, want the seat's GPU", sees)
	}

	deletePod(t, c, "mps")
	waitUntil(t, "the daemon of GPU 0 gone with its last pod", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(root, "g0-1x"))
		return os.IsNotExist(err)
	})
}

// The device-plugin shim serves MPS seats as the DRA plugin does: a legacy
// pod's container gets its share and cannot raise it, and the daemon stops
// once the kubelet's PodResources API no longer lists a container holding
// a seat of its group (the device-plugin API never says so itself).
func TestShimMPSOnARealKubelet(t *testing.T) {
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	c := startCluster(t)
	n, _ := startNode(t, c, realnode.Options{Name: "node-sm", Preset: "dgx-h100", Config: mpsConfig, Shim: true,
		PluginArgs: []string{"--mps-root", root, "--mps-control", control, "--pod-resources-poll-interval", "1s"},
		ImageFiles: map[string]string{"bin/nvidia-cuda-mps-control": control}})
	n.WaitForResources(t, "kyb.ai/gpu-1x-seat")

	createPod(t, c, podSpec{name: "shim-mps", node: n.Name, limits: v1.ResourceList{"kyb.ai/gpu-1x-seat": *resource.NewQuantity(2, resource.DecimalSI)},
		command: mpsClientCommand + probe})
	o := waitForOutput(t, c, "shim-mps", "app")
	t.Logf("pod shim-mps's container printed:\n%s", o.raw)
	// Two seats of four on one 81559 MiB GPU: half, rounded down.
	isMPSClient(t, o, "50", "0=40779M")
	groups, err := filepath.Glob(filepath.Join(root, "g*-1x"))
	if err != nil || len(groups) != 1 {
		t.Fatalf("MPS daemons %v (%v), want the pod's group's", groups, err)
	}
	// Past the shim's 10 s grace for hand-outs the kubelet does not list
	// yet, the kubelet's list alone keeps the daemon of a running pod.
	time.Sleep(12 * time.Second)
	if _, err := os.Stat(groups[0]); err != nil {
		t.Errorf("the daemon of a running pod's group: %v", err)
	}

	deletePod(t, c, "shim-mps")
	waitUntil(t, "the daemon gone once the kubelet no longer lists its seats", time.Minute, func() bool {
		_, err := os.Stat(groups[0])
		return os.IsNotExist(err)
	})
}
