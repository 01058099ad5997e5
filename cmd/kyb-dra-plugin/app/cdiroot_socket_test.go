package app

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/fifotest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/kubelettest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// FIFOs in the CDI root, named as NVIDIA's spec and as a claim's, would
// block the plugin's start for ever where it reads the directory (a FIFO
// with no writer blocks its reader): the plugin, started as its command
// line starts it, leaves them out with a warning naming each, takes
// NVIDIA's spec beside them, registers with the kubelet over its socket
// and prepares a claim.
func TestPluginStartsBesideFIFOsInTheCDIRootOverSockets(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()
	base := sockettest.Dir(t)
	dirs := map[string]string{}
	for _, d := range []string{"registry", "plugins", "cdi", "device-plugins"} {
		dirs[d] = filepath.Join(base, d)
		if err := os.Mkdir(dirs[d], 0o750); err != nil {
			t.Fatal(err)
		}
	}
	var spec bytes.Buffer
	spec.WriteString("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n")
	for i := range 8 {
		fmt.Fprintf(&spec, "- name: \"%d\"\n  containerEdits: {deviceNodes: [{path: /dev/nvidia%d}]}\n", i, i)
	}
	if err := os.WriteFile(filepath.Join(dirs["cdi"], "nvidia.yaml"), spec.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	fifos := []string{filepath.Join(dirs["cdi"], "nvidia-other.yaml"), filepath.Join(dirs["cdi"], cdi.SpecName("0b7d9a0e-2b36-4f4e-9d5c-1f1c2c3d4e5f")+".json")}
	for _, p := range fifos {
		fifotest.Make(t, p)
	}

	src := nodesetup.Flags{NodeName: "node-1", Simulate: "dgx-h100", DriverRoot: "/", DevRoot: "/", SysfsRoot: "/sys"}
	node, err := src.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node.Close(ctx)
	group := node.Plan.Profiles[0].Groups[0]
	uid := types.UID("6a1e0c3b-7d2f-4e5a-9b8c-0d1e2f3a4b5d")
	claim, err := kubelettest.AllocatedClaim(ctx, node.Plan, node.Inv, "node-1", group, "claim-1", uid)
	if err != nil {
		t.Fatal(err)
	}
	api := kubelettest.API("node-1")
	if _, err := api.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--simulate", "dgx-h100", "--node-name", "node-1", "--driver-files", "nvidia-cdi",
		"--cdi-root", dirs["cdi"], "--kubelet-plugins-directory-path", dirs["plugins"], "--kubelet-registrar-directory-path", dirs["registry"],
		"--device-plugin-directory-path", dirs["device-plugins"], "--pod-resources-socket", "", "--container-runtime-socket", ""}
	var stdout, stderr bytes.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- RunWithClients(ctx, Clients{Prepare: api, Background: api}, args, func(string) string { return "" }, &stdout, &stderr)
	}()
	defer func() {
		cancel()
		if !fifotest.Returns(t, time.Minute, func() { <-exited }, fifos...) {
			t.Error("the plugin did not stop within a minute")
		}
	}()

	var prepared bool
	if !fifotest.Returns(t, time.Minute, func() {
		kubelet, err := kubelettest.Register(ctx, dirs["registry"], driver.Name, 50*time.Second)
		if err != nil {
			t.Errorf("the plugin did not register: %v\n%s", err, stderr.String())
			return
		}
		defer kubelet.Close()
		if _, err := kubelet.Prepare(ctx, claim); err != nil {
			t.Errorf("prepare: %v", err)
			return
		}
		prepared = true
	}, fifos...) {
		t.Fatalf("the plugin's start blocked on a FIFO in its CDI root %v", fifos)
	}
	if !prepared {
		return
	}
	w, err := cdi.NewWriter(dirs["cdi"])
	if err != nil {
		t.Fatal(err)
	}
	if !w.Exists(uid) {
		t.Errorf("no CDI spec of the prepared claim in %s", dirs["cdi"])
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, want := range []string{
		`CDI spec left out warning="read CDI spec: ` + fifos[0] + ` is a FIFO, not a regular file"`,
		`Driver files mode="nvidia-cdi"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("the plugin's log lacks %s:\n%s", want, logs)
		}
	}
}
