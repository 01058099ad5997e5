package doctor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

// TestMain removes the probe built once for every test of the package.
func TestMain(m *testing.M) {
	code := m.Run()
	if probeDir != "" {
		_ = os.RemoveAll(probeDir)
	}
	os.Exit(code)
}

// The probe and the fake libcuda (and one whose cuInit hangs) are built
// once for every test.
var (
	probeDir  string
	buildOnce sync.Once
	probeBin  string
	fakeCUDA  string
	hangCUDA  string
	buildErr  error
)

func buildProbe(t *testing.T) (probe, libcuda string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the probe's sandbox needs a mount namespace: run the tests as root (CI does)")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kyb-probe-build-")
		if err != nil {
			buildErr = err
			return
		}
		probeDir = dir
		probeBin, fakeCUDA = filepath.Join(dir, "kyb-cuda-probe"), filepath.Join(dir, "libcuda.so.580.95.05")
		if out, err := exec.Command("go", "build", "-o", probeBin, "../../cmd/kyb-cuda-probe").CombinedOutput(); err != nil {
			buildErr = err
			probeBin = string(out)
			return
		}
		hangCUDA = filepath.Join(dir, "hang", "libcuda.so.580.95.05")
		if err := os.Mkdir(filepath.Dir(hangCUDA), 0o755); err != nil {
			buildErr = err
			return
		}
		for lib, flags := range map[*string][]string{&fakeCUDA: nil, &hangCUDA: {"-DFAKE_CUINIT_HANGS"}} {
			// -lm after the source: libm is NEEDED, as by the real
			// library, whatever the linker's --as-needed default.
			args := append([]string{"-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", *lib, "testdata/fakecuda.c", "-lm"}, flags...)
			if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
				buildErr = err
				*lib = string(out)
			}
		}
	})
	if buildErr != nil {
		t.Fatalf("build the probe and the fake libcuda: %v: %s%s", buildErr, probeBin, fakeCUDA)
	}
	return probeBin, fakeCUDA
}

// probeNode is a healthy node with a driver root holding the fake libcuda
// and a /dev whose GPU nodes hold their GPUs' UUIDs, as the fake reads
// them.
func probeNode(t *testing.T) (*node, *inventory.Inventory) {
	_, libcuda := buildProbe(t)
	return probeNodeWith(t, libcuda)
}

// probeNodeWith is probeNode with another libcuda in the driver root.
func probeNodeWith(t *testing.T, libcuda string) (*node, *inventory.Inventory) {
	probe, _ := buildProbe(t)
	n := newNode(t)
	lib := filepath.Join(n.root, "driver/usr/lib/x86_64-linux-gnu")
	n.mkdir(lib)
	data, err := os.ReadFile(libcuda)
	if err != nil {
		t.Fatal(err)
	}
	n.write(filepath.Join(lib, "libcuda.so.580.95.05"), string(data))
	if err := os.Symlink("libcuda.so.580.95.05", filepath.Join(lib, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	n.opts.Node.DriverRoot = filepath.Join(n.root, "driver")
	n.opts.Node.DevRoot = filepath.Join(n.root, "devroot")
	_, ctx := ktesting.NewTestContext(t)
	host, err := n.opts.Node.OpenHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = host.Close() }()
	inv, err := nodesetup.Discover(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range inv.GPUs {
		n.write(filepath.Join(n.opts.Node.DevRoot, "dev", "nvidia"+strconv.Itoa(g.Minor)), g.UUID+"\n")
	}
	for _, p := range containeredits.ControlDevices {
		n.write(filepath.Join(n.opts.Node.DevRoot, p), "")
	}
	n.opts.Probe = &ProbeOptions{Program: probe}
	return n, inv
}

// deviceNumbers are the simulated node's device numbers, which the plugin
// writes into a spec: a runtime makes a container's nodes from them.
func (n *node) deviceNumbers() func(string) (int64, int64, error) {
	_, ctx := ktesting.NewTestContext(n.t)
	host, err := n.opts.Node.OpenHost(ctx)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = host.Close() })
	return host.DeviceNumbers
}

func TestProbeSeesExactlyTheSeatsGPUs(t *testing.T) {
	n, inv := probeNode(t)
	n.opts.Probe.Group = "G23"
	r := n.run(t)
	c := check(t, r, "probe")
	if c.Status != OK || r.Failed() {
		t.Fatalf("probe: %+v", c)
	}
	details := strings.Join(c.Details, "\n")
	for _, want := range []string{
		"CUDA device 0: Simulated GPU (/dev/nvidia2) " + inv.GPUs[2].UUID + ", 81559 MiB, cuMemAlloc ok",
		"CUDA device 1: Simulated GPU (/dev/nvidia3) " + inv.GPUs[3].UUID,
		"env KYB_GPU_GROUP=G23",
		"libcuda: /usr/lib/x86_64-linux-gnu/libcuda.so.1 (CUDA driver API 13000)",
		// The sandbox holds the seat's device nodes and nothing else of
		// the host's /dev.
		"device nodes: /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia2 /dev/nvidia3 /dev/nvidiactl\n",
	} {
		if !strings.Contains(details, want) {
			t.Errorf("probe details lack %q", want)
		}
	}
}

func TestProbeOfAPreparedClaim(t *testing.T) {
	n, inv := probeNode(t)
	uid := "6d0f4a1c-0c3e-4d7b-9a57-5b1f3c1d2e90"
	files, err := containeredits.FindDriverFiles(n.opts.Node.DriverRoot, "")
	if err != nil {
		t.Fatal(err)
	}
	// The spec the plugin writes for a claim holding seat 2 of G5.
	edits, err := containeredits.Build([]containeredits.Seat{{Group: "G5", Seats: []int{2}, Generations: []int64{7}, GPUs: []inventory.GPU{inv.GPUs[5]}}},
		containeredits.Options{DeviceNumbers: n.deviceNumbers(), Driver: files})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cdi.NewWriter(n.opts.CDIRoot)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(types.UID(uid), []cdi.Device{{Name: "g5-1x-0", Edits: edits}}); err != nil {
		t.Fatal(err)
	}
	n.recordClaim(inv, types.UID(uid), "G5", []int{5})
	n.opts.Probe.Claim = types.UID(uid)
	c := check(t, n.run(t), "probe")
	if c.Status != OK || !strings.Contains(c.Summary, "claim "+uid) || !strings.Contains(strings.Join(c.Details, "\n"), "env KYB_SEAT_GEN=7") {
		t.Fatalf("probe of claim: %+v", c)
	}
}

// TestProbeFailsForRealReasons breaks what a container would need and
// expects the probe, not a rule of the doctor, to find it.
func TestProbeFailsForRealReasons(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(n *node, inv *inventory.Inventory)
		want    string
	}{
		{name: "no driver files", breakIt: func(n *node, _ *inventory.Inventory) { n.opts.Node.DriverRoot = "/" },
			want: "the probe saw no GPU: dlopen libcuda.so.1: libcuda.so.1: cannot open shared object file"},
		{name: "a GPU's device node missing on the host", breakIt: func(n *node, _ *inventory.Inventory) {
			// The sandbox makes the node from its numbers, as runc does;
			// with no driver behind it, CUDA cannot see the GPU.
			if err := os.Remove(filepath.Join(n.opts.Node.DevRoot, "dev/nvidia0")); err != nil {
				n.t.Fatal(err)
			}
		}, want: "the probe saw no GPU: cuInit: CUDA error 100"},
		{name: "a spec that gives another GPU too", breakIt: func(n *node, inv *inventory.Inventory) {
			uid := "1c2d3e4f-0000-4000-8000-000000000001"
			n.write(filepath.Join(n.opts.CDIRoot, cdi.SpecName(types.UID(uid))+".json"), `{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu","devices":[{"name":"`+uid+`-g0-1x-0","containerEdits":{
				"env":["NVIDIA_VISIBLE_DEVICES=`+inv.GPUs[0].UUID+`"],
				"deviceNodes":[{"path":"/dev/nvidia0"},{"path":"/dev/nvidia1"},{"path":"/dev/nvidiactl"}],
				"mounts":[{"hostPath":"`+filepath.Join(n.opts.Node.DriverRoot, "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05")+`","containerPath":"/usr/lib/x86_64-linux-gnu/libcuda.so.1","options":["ro","bind"]}]}}]}`)
			n.recordClaim(inv, types.UID(uid), "G0", []int{0})
			n.opts.Probe.Claim = types.UID(uid)
		}, want: "the probe saw [" + "GPU-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, inv := probeNode(t)
			tt.breakIt(n, inv)
			r := n.run(t)
			c := check(t, r, "probe")
			if c.Status != Fail || !strings.Contains(c.Summary, tt.want) || c.Fix == "" {
				t.Errorf("probe: %s %q, want fail with %q", c.Status, c.Summary, tt.want)
			}
		})
	}
}
