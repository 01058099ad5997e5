package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/kubelettest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// The shim gone, its pods keep running on the GPUs it handed out: the
// plugin, started as its command line starts it, does not take the node
// over while the kubelet lists a container holding a device of the shim's
// resources (here a MIG seat, whose instance it would destroy), naming
// the pod; nor where the kubelet cannot be asked. Another vendor's device
// plugin does not stop it; once the node is drained of the shim's pods
// it starts and registers.
func TestPluginRefusesToTakeOverWhilePodsOfTheShimHoldGPUsOverSockets(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	base := sockettest.Dir(t)
	dirs := map[string]string{}
	for _, d := range []string{"registry", "plugins", "cdi", "device-plugins"} {
		dirs[d] = filepath.Join(base, d)
		if err := os.Mkdir(dirs[d], 0o750); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(base, "config.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: kyb.ai/v1alpha1\nkind: NodeConfig\nprofiles:\n- {resource: kyb.ai/gpu-1x-seat}\n- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	kubelet := podresourcestest.Start(t, filepath.Join(base, "pod-resources.sock"))
	kubelet.SetPodResources(&podresourcesapi.PodResources{Namespace: "team-a", Name: "legacy", Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "kyb.ai/mig-1g.10gb", DeviceIds: []string{"g0-mig-1g-10gb-6"}}},
	}}})
	kubelet.SetPodResources(&podresourcesapi.PodResources{Namespace: "team-b", Name: "nic", Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "rdma.example.com/hca", DeviceIds: []string{"mlx5-0"}}},
	}}})
	args := func(socket string) []string {
		return []string{"--simulate", "dgx-h100", "--node-name", "node-1", "--config", config, "--driver-files", "none",
			"--cdi-root", dirs["cdi"], "--kubelet-plugins-directory-path", dirs["plugins"], "--kubelet-registrar-directory-path", dirs["registry"],
			"--device-plugin-directory-path", dirs["device-plugins"], "--pod-resources-socket", socket, "--container-runtime-socket", ""}
	}
	api := kubelettest.API("node-1")
	run := func(ctx context.Context, socket string, stderr *bytes.Buffer) int {
		return RunWithClients(klog.NewContext(ctx, klog.FromContext(ctx)), Clients{Prepare: api, Background: api}, args(socket), func(string) string { return "" }, &bytes.Buffer{}, stderr)
	}

	// A plugin that does not refuse runs until this ends.
	refused, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	var stderr bytes.Buffer
	if code := run(refused, kubelet.Socket, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "pods still hold GPUs the kyb device-plugin shim handed out (team-a/legacy container app: kyb.ai/mig-1g.10gb g0-mig-1g-10gb-6)") ||
		strings.Contains(stderr.String(), "team-b") {
		t.Fatalf("start while a pod of the shim holds a GPU: exit %d, stderr:\n%s\nwant a refusal naming the shim's pod only", code, stderr.String())
	}
	stderr.Reset()
	if code := run(refused, filepath.Join(base, "nope.sock"), &stderr); code != 1 || !strings.Contains(stderr.String(), "ask the kubelet whether pods of the kyb device-plugin shim still hold this node's GPUs") {
		t.Errorf("start where the kubelet cannot be asked: exit %d, stderr:\n%s", code, stderr.String())
	}

	kubelet.RemovePod("team-a", "legacy")
	stderr.Reset()
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, kubelet.Socket, &stderr) }()
	defer func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Error("the plugin did not stop within a minute")
		}
	}()
	registered, err := kubelettest.Register(ctx, dirs["registry"], driver.Name, 50*time.Second)
	if err != nil {
		t.Fatalf("the plugin did not register once the node was drained: %v", err)
	}
	registered.Close()
}

// The shim serves whatever resource names its configuration gives (any
// domain: nvidia.com/mig-1g.10gb keeps the workloads of NVIDIA's device
// plugin unchanged), and the configuration a node has when it moves to the
// DRA plugin need not be the one the shim served. A pod still holding a
// shim seat is told by the seat's ID, which names a device of the
// plugin's own (g0-mig-1g-10gb-6: the same MIG instance, which the
// plugin's start would destroy), whatever its resource: the plugin does
// not take the node over while the kubelet lists it.
func TestPluginRefusesToTakeOverFromAShimResourceOutsideItsDomainOverSockets(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	base := sockettest.Dir(t)
	dirs := map[string]string{}
	for _, d := range []string{"registry", "plugins", "cdi", "device-plugins"} {
		dirs[d] = filepath.Join(base, d)
		if err := os.Mkdir(dirs[d], 0o750); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(base, "config.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: kyb.ai/v1alpha1\nkind: NodeConfig\nprofiles:\n- {resource: kyb.ai/gpu-1x-seat}\n- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	kubelet := podresourcestest.Start(t, filepath.Join(base, "pod-resources.sock"))
	kubelet.SetPodResources(&podresourcesapi.PodResources{Namespace: "team-a", Name: "legacy", Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "nvidia.com/mig-1g.10gb", DeviceIds: []string{"g0-mig-1g-10gb-6"}}},
	}}})
	args := []string{"--simulate", "dgx-h100", "--node-name", "node-1", "--config", config, "--driver-files", "none",
		"--cdi-root", dirs["cdi"], "--kubelet-plugins-directory-path", dirs["plugins"], "--kubelet-registrar-directory-path", dirs["registry"],
		"--device-plugin-directory-path", dirs["device-plugins"], "--pod-resources-socket", kubelet.Socket, "--container-runtime-socket", ""}
	api := kubelettest.API("node-1")
	var stderr bytes.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- RunWithClients(klog.NewContext(ctx, klog.FromContext(ctx)), Clients{Prepare: api, Background: api}, args, func(string) string { return "" }, &bytes.Buffer{}, &stderr)
	}()
	// The plugin's exit is received once: here, or by the wait below.
	stopped := false
	defer func() {
		cancel()
		if stopped {
			return
		}
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Error("the plugin did not stop within a minute")
		}
	}()
	registered, err := kubelettest.Register(ctx, dirs["registry"], driver.Name, 20*time.Second)
	if err == nil {
		registered.Close()
		t.Fatal("the plugin took the node over while a pod holds the shim's seat g0-mig-1g-10gb-6 (resource nvidia.com/mig-1g.10gb), whose MIG instance its start destroys")
	}
	select {
	case code := <-exited:
		stopped = true
		if code != 1 || !strings.Contains(stderr.String(), "team-a/legacy") {
			t.Errorf("exit %d, stderr:\n%s\nwant a refusal naming the shim's pod", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Error("the plugin neither registered nor refused")
	}
}
