package doctor

import (
	"path/filepath"
	"strings"
	"testing"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// Draining the node of the shim's pods is a checked step: asked where the
// kubelet's PodResources API is, the doctor fails while a container holds
// a device of the shim's resources, naming it and saying to drain, and
// passes once the pod is gone; where the kubelet cannot be asked it fails
// too, as the plugin refuses to start then. Another vendor's devices are
// not the shim's.
func TestHandoverFailsWhilePodsOfTheShimHoldGPUs(t *testing.T) {
	n := newNode(t)
	kubelet := podresourcestest.Start(t, filepath.Join(sockettest.Dir(t), "kubelet.sock"))
	kubelet.SetPodResources(&podresourcesapi.PodResources{Namespace: "team-a", Name: "legacy", Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "kyb.ai/gpu-2x-seat", DeviceIds: []string{"g45-2x-seat-0", "g45-2x-seat-1"}}},
	}}})
	kubelet.SetPodResources(&podresourcesapi.PodResources{Namespace: "team-b", Name: "nic", Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "rdma.example.com/hca", DeviceIds: []string{"mlx5-0"}}},
	}}})
	n.opts.PodResourcesSocket = kubelet.Socket

	c := check(t, n.run(t), "handover")
	if c.Status != Fail || len(c.Details) != 1 || c.Details[0] != "team-a/legacy container app: kyb.ai/gpu-2x-seat g45-2x-seat-0,g45-2x-seat-1" || !strings.Contains(c.Fix, "drain the node") {
		t.Errorf("handover while a pod of the shim holds a GPU: %+v, want a failure naming it and the drain", c)
	}

	kubelet.RemovePod("team-a", "legacy")
	if c := check(t, n.run(t), "handover"); c.Status != OK || !strings.Contains(c.Summary, "no container of the kubelet's 1 pods holds a GPU of the device-plugin shim") {
		t.Errorf("handover once drained: %+v", c)
	}

	n.opts.PodResourcesSocket = filepath.Join(n.root, "nope.sock")
	if c := check(t, n.run(t), "handover"); c.Status != Fail || !strings.Contains(c.Summary, "cannot be asked") {
		t.Errorf("handover where the kubelet cannot be asked: %+v", c)
	}
}
