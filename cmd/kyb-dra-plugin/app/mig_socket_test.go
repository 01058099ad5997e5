package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/kubelettest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// The plugin, started as its command line starts it on a simulated H100
// node with a MIG profile, makes a claim's MIG instance at prepare: its
// spec names the instance's MIG- UUID and capability nodes.
func TestPluginMakesMIGInstancesOverSockets(t *testing.T) {
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
	src := nodesetup.Flags{NodeName: "node-1", Simulate: "dgx-h100", ConfigPath: config, DriverRoot: "/", DevRoot: "/", SysfsRoot: "/sys"}
	node, err := src.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node.Close(ctx)
	cluster := schedulertest.New(schedulertest.SchedulerFeatures())
	cluster.AddNode("node-1", draresources.Resources(node.Plan, node.Inv, "node-1", draresources.LayoutShared), driver.Name)
	cluster.AddClasses(draresources.DeviceClasses(node.Plan.Profiles, draresources.DeviceClassOptions{})...)
	claim := schedulertest.Claim("claim-1", "mig-1g.10gb.kyb.ai", 1)
	claim.UID = "6a1e0c3b-7d2f-4e5a-9b8c-0d1e2f3a4b5e"
	alloc, err := cluster.Allocate(ctx, claim, "node-1")
	if err != nil || alloc == nil {
		t.Fatalf("allocate: %v %v", alloc, err)
	}
	claim.Status.Allocation = alloc
	api := kubelettest.API("node-1")
	if _, err := api.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--simulate", "dgx-h100", "--node-name", "node-1", "--config", config, "--driver-files", "none",
		"--cdi-root", dirs["cdi"], "--kubelet-plugins-directory-path", dirs["plugins"], "--kubelet-registrar-directory-path", dirs["registry"],
		"--device-plugin-directory-path", dirs["device-plugins"], "--pod-resources-socket", "", "--container-runtime-socket", ""}
	var stdout, stderr bytes.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- RunWithClients(klog.NewContext(ctx, klog.FromContext(ctx)), Clients{Prepare: api, Background: api}, args, func(string) string { return "" }, &stdout, &stderr)
	}()
	defer func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(time.Minute):
			t.Error("the plugin did not stop within a minute")
		}
	}()
	kubelet, err := kubelettest.Register(ctx, dirs["registry"], driver.Name, 50*time.Second)
	if err != nil {
		t.Fatalf("the plugin did not register: %v\n%s", err, stderr.String())
	}
	defer kubelet.Close()
	if _, err := kubelet.Prepare(ctx, claim); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	w, err := cdi.NewWriter(dirs["cdi"])
	if err != nil {
		t.Fatal(err)
	}
	env, ok, err := w.ReadEnv(claim.UID)
	if err != nil || !ok {
		t.Fatalf("the claim's CDI spec: %v %v", ok, err)
	}
	for dev, vars := range env {
		if !strings.HasPrefix(vars["CUDA_VISIBLE_DEVICES"], "MIG-") {
			t.Errorf("CDI device %s: CUDA_VISIBLE_DEVICES=%q, want a MIG- UUID", dev, vars["CUDA_VISIBLE_DEVICES"])
		}
	}
	raw, err := os.ReadFile(filepath.Join(dirs["cdi"], cdi.SpecName(claim.UID)+".json"))
	if err != nil || !strings.Contains(string(raw), "/dev/nvidia-caps/nvidia-cap") {
		t.Errorf("the claim's CDI spec lacks the capability nodes: %v\n%s", err, raw)
	}
	if err := kubelet.Unprepare(ctx, claim); err != nil {
		t.Errorf("unprepare: %v", err)
	}
}
