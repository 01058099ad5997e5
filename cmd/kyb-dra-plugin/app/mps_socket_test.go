package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/kubelettest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// TestMain is this test binary's main as cmd/kyb-dra-plugin's is: the
// plugin under test runs its own binary, this one, as a simulated node's
// MPS daemon.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == mpssim.Command {
		os.Exit(mpssim.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// A simulated node serves an MPS profile with no --mps-control: the
// plugin, started as its command line starts it, runs the simulated
// daemon from its own binary, and a claim prepared over the kubelet's
// sockets gets a daemon that holds the seat's share.
func TestSimulatedNodeRunsItsOwnMPSDaemonOverSockets(t *testing.T) {
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
	cfg := filepath.Join(base, "config.yaml")
	if err := os.WriteFile(cfg, []byte("profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, sharing: {strategy: mps}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := nodesetup.Flags{NodeName: "node-1", Simulate: "dgx-h100", ConfigPath: cfg, DriverRoot: "/", DevRoot: "/", SysfsRoot: "/sys"}
	node, err := src.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node.Close(ctx)
	group := node.Plan.Profiles[0].Groups[0]
	uid := types.UID("6a1e0c3b-7d2f-4e5a-9b8c-0d1e2f3a4b5c")
	claim, err := kubelettest.AllocatedClaim(ctx, node.Plan, node.Inv, "node-1", group, "claim-1", uid)
	if err != nil {
		t.Fatal(err)
	}
	api := kubelettest.API("node-1")
	if _, err := api.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The node's boot as --boot-id-file names it, not as /proc does.
	bootID := filepath.Join(base, "boot_id")
	if err := os.WriteFile(bootID, []byte("boot-of-the-flag\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--simulate", "dgx-h100", "--node-name", "node-1", "--config", cfg,
		"--cdi-root", dirs["cdi"], "--kubelet-plugins-directory-path", dirs["plugins"], "--kubelet-registrar-directory-path", dirs["registry"],
		"--device-plugin-directory-path", dirs["device-plugins"], "--pod-resources-socket", "", "--container-runtime-socket", "",
		"--boot-id-file", bootID}
	var stdout, stderr bytes.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- RunWithClients(ctx, Clients{Prepare: api, Background: api}, args, func(string) string { return "" }, &stdout, &stderr)
	}()
	stop := func() {
		cancel()
		select {
		case code := <-exited:
			if code != 0 {
				t.Errorf("the plugin exited %d: %s", code, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Error("the plugin did not stop within 30s")
		}
	}
	defer stop()
	kubelet, err := kubelettest.Register(ctx, dirs["registry"], driver.Name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer kubelet.Close()
	if _, err := kubelet.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}

	// The daemon runs from the plugin's binary, under its subcommand, in
	// the group's directory.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dirs["plugins"], driver.Name, "mps", group.DeviceName())
	pipe := filepath.Join(dir, mps.PipeDir)
	daemons := mpstest.Daemons(t, self)
	if len(daemons) != 1 {
		t.Fatalf("%d simulated daemons run from %s, want 1: %v", len(daemons), self, daemons)
	}
	for pid, p := range daemons {
		if p != pipe {
			t.Errorf("the daemon serves %s, want %s", p, pipe)
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if want := self + "\x00" + mpssim.Command + "\x00-f\x00"; err != nil || string(cmdline) != want {
			t.Errorf("the daemon runs as %q, want %q", cmdline, want)
		}
		// The plugin recorded it, as it records a real daemon, in the boot
		// --boot-id-file names.
		var rec struct {
			PID    int    `json:"pid"`
			BootID string `json:"bootID"`
		}
		data, err := os.ReadFile(filepath.Join(dir, "daemon.json"))
		if err != nil || json.Unmarshal(data, &rec) != nil || rec.PID != pid || rec.BootID != "boot-of-the-flag" {
			t.Errorf("the daemon's record %s (%v) does not name PID %d in boot boot-of-the-flag", data, err, pid)
		}
	}

	// A CUDA process of the claim's container joins with the container's
	// environment and gets the seat's share: a quarter of the GPU.
	w, err := cdi.NewWriter(dirs["cdi"])
	if err != nil {
		t.Fatal(err)
	}
	envs, ok, err := w.ReadEnv(uid)
	if err != nil || !ok || len(envs) != 1 {
		t.Fatalf("the claim's CDI spec: %v %v %v", envs, ok, err)
	}
	for _, env := range envs {
		quarter := node.Inv.GPUs[group.GPUs[0]].MemoryMiB / 4
		got := mpstest.JoinCommand(t, []string{self, mpssim.Command}, pipe, env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
		if want := fmt.Sprintf("thread=25 mem=0=%dM", quarter); got != want {
			t.Errorf("the seat's container got %q from the daemon, want %q", got, want)
		}
	}
	if got := mpstest.LastCommand(t, filepath.Join(dir, mps.LogDir), "set_default_active_thread_percentage"); got != "set_default_active_thread_percentage 25" {
		t.Errorf("the daemon was told %q", got)
	}

	// Released, the group's daemon goes.
	if err := kubelet.Unprepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if daemons := mpstest.Daemons(t, self); len(daemons) != 0 {
		t.Errorf("daemons run after the release: %v", daemons)
	}
}
