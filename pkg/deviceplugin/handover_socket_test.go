package deviceplugin

import (
	"path/filepath"
	"strings"
	"testing"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// withPodResources asks the kubelet's PodResources API at socket.
func withPodResources(t *testing.T, socket string) func(*Options) {
	client, err := podresources.NewClient(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return func(o *Options) { o.PodResources = client.List }
}

// holding is a pod whose container holds device-plugin devices of one
// resource, as the kubelet lists it.
func holding(namespace, name, resource string, ids ...string) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: namespace, Name: name, Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: resource, DeviceIds: ids}},
	}}}
}

// claimHolding is a pod whose container references a claim with a device
// a driver prepared, as the kubelet lists it.
func claimHolding(namespace, name, claim, driverName, device string) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: namespace, Name: name, Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", DynamicResources: []*podresourcesapi.DynamicResource{{ClaimName: claim, ClaimNamespace: namespace,
			ClaimResources: []*podresourcesapi.ClaimResource{{DriverName: driverName, PoolName: "node-1", DeviceName: device}}}},
	}}}
}

// The DRA plugin gone, its pods keep running on the GPUs it prepared: the
// shim does not start while the kubelet lists a container holding a
// device of the DRA plugin's, naming the pods, nor where the kubelet
// cannot be asked. Another driver's claims and the shim's own resources
// do not stop it; once the node is drained of the DRA plugin's pods it
// starts.
func TestShimRefusesToTakeOverWhilePodsOfTheDRAPluginHoldGPUsOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	kubelet := podresourcestest.Start(t, filepath.Join(sockettest.Dir(t), "kubelet.sock"))
	kubelet.SetPodResources(claimHolding("team-a", "trainer", "gpus", driver.Name, "g01-2x"))
	kubelet.SetPodResources(claimHolding("team-b", "nic", "rdma", "rdma.example.com", "mlx5-0"))
	kubelet.SetPodResources(holding("team-c", "legacy", "kyb.ai/gpu-1x-seat", "g7-1x-seat-0"))
	asked := withPodResources(t, kubelet.Socket)
	e.kubelet.start()
	_, err := e.tryStart(asked)
	if err == nil || !strings.Contains(err.Error(), "pods still hold GPUs the kyb DRA plugin prepared (team-a/trainer container app: claim team-a/gpus)") ||
		!strings.Contains(err.Error(), "drain the node") {
		t.Fatalf("start while a pod of the DRA plugin holds a GPU: %v, want a refusal naming it", err)
	}
	if got := e.kubelet.registered(); len(got) != 0 {
		t.Errorf("the refused shim registered %v", got)
	}

	// A kubelet that cannot be asked says nothing of the DRA plugin's pods.
	_, err = e.tryStart(withPodResources(t, filepath.Join(e.dir, "no-kubelet.sock")))
	if err == nil || !strings.Contains(err.Error(), "ask the kubelet whether pods of the kyb DRA plugin still hold this node's GPUs") {
		t.Errorf("start where the kubelet cannot be asked: %v", err)
	}

	kubelet.RemovePod("team-a", "trainer")
	e.startPlugin(asked)
	e.waitRegistered(len(e.plugin.Resources()))
}
