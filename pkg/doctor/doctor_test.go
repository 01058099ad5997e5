package doctor

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/fifotest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// node is a simulated node's file system as the doctor sees it: the
// kubelet's directories, a CDI root and a host root with a runtime
// configuration, all healthy until a test breaks one.
type node struct {
	t    testing.TB
	root string
	opts Options
}

func newNode(t testing.TB) *node {
	root := sockettest.Dir(t)
	n := &node{t: t, root: root}
	n.opts = Options{
		Node:             nodesetup.Flags{NodeName: "node-1", Simulate: "dgx-h100", DriverRoot: "/", DevRoot: "/", SysfsRoot: "/sys"},
		CDIRoot:          filepath.Join(root, "cdi"),
		PluginsDir:       filepath.Join(root, "kubelet/plugins"),
		RegistrarDir:     filepath.Join(root, "kubelet/plugins_registry"),
		DevicePluginDir:  filepath.Join(root, "kubelet/device-plugins"),
		HostRoot:         filepath.Join(root, "host"),
		ContainerdConfig: "/etc/containerd/config.toml",
		CRIOConfig:       "/etc/crio/crio.conf",
		// The boot the plugin's instances of the MIG tests are made in
		// (migNode.pluginInstance).
		BootID: "boot-1",
	}
	n.opts.DriverFiles.Mode = cli.NewOneOf(nodesetup.DriverFilesAuto, nodesetup.DriverFilesAuto, nodesetup.DriverFilesNVIDIACDI, nodesetup.DriverFilesDriverRoot, nodesetup.DriverFilesNone)
	for _, d := range []string{n.opts.CDIRoot, n.opts.PluginsDir, n.opts.RegistrarDir, n.opts.DevicePluginDir} {
		n.mkdir(d)
	}
	n.containerd("version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  cdi_spec_dirs = [\"/etc/cdi\", \"CDI_ROOT\"]\n")
	return n
}

func (n *node) mkdir(d string) {
	n.t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) write(path, text string) string {
	n.t.Helper()
	n.mkdir(filepath.Dir(path))
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		n.t.Fatal(err)
	}
	return path
}

func (n *node) run(t *testing.T) *Report {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	r := Run(ctx, n.opts)
	var out bytes.Buffer
	if err := WriteTable(&out, r); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	return r
}

func check(t *testing.T, r *Report, name string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in the report", name)
	return Check{}
}

func TestHealthyNodeIsOK(t *testing.T) {
	n := newNode(t)
	r := n.run(t)
	if r.Failed() || r.Counts[Warn] != 0 {
		t.Fatalf("a healthy simulated node: %v", r.Counts)
	}
	want := []string{"config", "nvml", "gpus", "topology", "plan", "driver-files", "nvidia-cdi", "cdi-root", "kubelet", "runtime-cdi", "checkpoint"}
	if len(r.Checks) != len(want) {
		t.Fatalf("%d checks, want %d", len(r.Checks), len(want))
	}
	for i, c := range r.Checks {
		if c.Name != want[i] {
			t.Errorf("check %d is %s, want %s", i, c.Name, want[i])
		}
	}
	if c := check(t, r, "gpus"); len(c.Details) != 8 || !strings.Contains(c.Summary, "8x NVIDIA H100") {
		t.Errorf("gpus: %+v", c)
	}
	if c := check(t, r, "plan"); c.Summary != "14 groups in 3 profiles" {
		t.Errorf("plan: %q", c.Summary)
	}
	var out bytes.Buffer
	if err := WriteJSON(&out, r); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || len(back.Checks) != len(want) || back.Counts[OK] != len(want) {
		t.Errorf("JSON round trip: %v %+v", err, back.Counts)
	}
}

// TestInjectedFailures breaks one thing at a time and expects the check
// that owns it to say so, with what to do.
func TestInjectedFailures(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(n *node)
		check   string
		status  Status
		want    string
	}{
		{name: "unknown preset", breakIt: func(n *node) { n.opts.Node.Simulate = "dgx-z" }, check: "nvml", status: Fail, want: `unknown preset "dgx-z"`},
		{name: "configuration with a bad line", breakIt: func(n *node) {
			n.opts.Node.ConfigPath = n.write(filepath.Join(n.root, "bad.yaml"), "profiles:\n- resource: kyb.ai/gpu-1x-seat\n  seatsPerGroup: 0\n")
		}, check: "config", status: Fail, want: "bad.yaml:3: profiles[0].seatsPerGroup"},
		{name: "configuration that does not fit the node", breakIt: func(n *node) {
			n.opts.Node.Simulate = "single-gpu"
			n.opts.Node.ConfigPath = n.write(filepath.Join(n.root, "big.yaml"), "groups:\n- {name: G01, gpus: [0, 1]}\n")
		}, check: "plan", status: Fail, want: "big.yaml:2: groups[0].gpus[1]: GPU 1 does not exist"},
		{name: "driver-root mode without libraries", breakIt: func(n *node) {
			n.driverFiles(nodesetup.DriverFilesDriverRoot)
			n.opts.Node.DriverRoot = n.root
		}, check: "driver-files", status: Fail, want: "no NVIDIA driver libraries under"},
		{name: "libraries of another driver version", breakIt: func(n *node) {
			n.opts.Node.DriverRoot = n.driverRoot("550.54.15")
		}, check: "driver-files", status: Warn, want: "not of driver 580.95.05: libcuda.so.550.54.15"},
		{name: "NVIDIA's CDI spec older than the driver", breakIt: func(n *node) {
			n.nvidiaSpec(8, filepath.Join(n.root, "gone/libcuda.so.550.54.15"))
		}, check: "nvidia-cdi", status: Fail, want: "names 1 file missing on this node"},
		{name: "NVIDIA's CDI spec for some GPUs only", breakIt: func(n *node) { n.nvidiaSpec(4, "") }, check: "nvidia-cdi", status: Warn, want: "covers 4 of 8 GPUs"},
		{name: "nvidia-cdi mode without the spec", breakIt: func(n *node) { n.driverFiles(nodesetup.DriverFilesNVIDIACDI) }, check: "driver-files", status: Fail, want: "covers 0 of 8 GPUs"},
		{name: "CDI root is a file", breakIt: func(n *node) {
			n.opts.CDIRoot = n.write(filepath.Join(n.root, "cdi-file"), "")
		}, check: "cdi-root", status: Fail, want: "is not a directory"},
		{name: "kubelet directories missing", breakIt: func(n *node) {
			n.opts.RegistrarDir = filepath.Join(n.root, "nowhere")
		}, check: "kubelet", status: Fail, want: "nowhere is not a directory"},
		{name: "the shim serves the node", breakIt: func(n *node) {
			sockettest.Listen(n.t, filepath.Join(n.opts.DevicePluginDir, "kyb-gpu-1x-seat.sock"))
		}, check: "kubelet", status: Fail, want: "the kyb device-plugin shim serves this node"},
		{name: "no runtime configuration", breakIt: func(n *node) { n.opts.ContainerdConfig = "/etc/none.toml" }, check: "runtime-cdi", status: Warn, want: "no containerd"},
		{name: "containerd 1.7 format without enable_cdi", breakIt: func(n *node) {
			n.containerd("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.10\"\n  cdi_spec_dirs = ['CDI_ROOT']\n")
		}, check: "runtime-cdi", status: Warn, want: "does not set enable_cdi"},
		{name: "containerd with CDI off", breakIt: func(n *node) {
			n.containerd("version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = false # off\n")
		}, check: "runtime-cdi", status: Fail, want: "CDI is off"},
		{name: "containerd with CDI off in an import", breakIt: func(n *node) {
			n.containerd("version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n")
			n.write(filepath.Join(n.opts.HostRoot, "etc/containerd/conf.d/cdi.toml"), "[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = false\n")
		}, check: "runtime-cdi", status: Fail, want: "CDI is off"},
		{name: "containerd reading other CDI directories", breakIt: func(n *node) {
			n.containerd("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = true\n  cdi_spec_dirs = [\n    \"/etc/cdi\",\n    \"/var/run/cdi\",\n  ]\n")
		}, check: "runtime-cdi", status: Fail, want: "but not from"},
		{name: "CRI-O reading other CDI directories", breakIt: func(n *node) {
			n.opts.ContainerdConfig = "/etc/none.toml"
			n.write(filepath.Join(n.opts.HostRoot, "etc/crio/crio.conf.d/10-cdi.conf"), "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\"]\n")
		}, check: "runtime-cdi", status: Fail, want: "CRI-O: CDI enabled (always, since CRI-O 1.23), but not from"},
		{name: "corrupt checkpoint", breakIt: func(n *node) {
			n.write(filepath.Join(driver.PluginDir(n.opts.PluginsDir), checkpoint.FileName), `{"version":"v1","data":{}}`)
		}, check: "checkpoint", status: Warn, want: "corrupt"},
		{name: "checkpoint of a newer plugin", breakIt: func(n *node) {
			n.write(filepath.Join(driver.PluginDir(n.opts.PluginsDir), checkpoint.FileName), newerCheckpoint)
		}, check: "checkpoint", status: Fail, want: "newer plugin"},
		{name: "a held group redefined since", breakIt: func(n *node) { n.checkpointHolding("G01", []int{0, 2}) }, check: "checkpoint", status: Warn, want: "today's configuration puts G01 on GPUs [0 1]"},
		{name: "a spec the checkpoint does not record", breakIt: func(n *node) {
			n.write(filepath.Join(n.opts.CDIRoot, "kyb.ai-gpu_0b7d9a0e-2b36-4f4e-9d5c-1f1c2c3d4e5f.json"), "{}")
		}, check: "checkpoint", status: Warn, want: "1 claim spec the checkpoint does not record"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			tt.breakIt(n)
			r := n.run(t)
			c := check(t, r, tt.check)
			text := c.Summary + "\n" + strings.Join(c.Details, "\n")
			if c.Status != tt.status || !strings.Contains(text, tt.want) {
				t.Errorf("%s: %s %q, want %s with %q", tt.check, c.Status, text, tt.status, tt.want)
			}
			if c.Fix == "" {
				t.Errorf("%s says what is wrong but not what to do", tt.check)
			}
			if r.Failed() != (tt.status == Fail) {
				t.Errorf("Failed() = %v with %s at %s", r.Failed(), tt.status, tt.check)
			}
		})
	}
}

func (n *node) driverFiles(mode string) {
	if err := n.opts.DriverFiles.Mode.Set(mode); err != nil {
		n.t.Fatal(err)
	}
}

// containerd writes containerd's configuration; CDI_ROOT in it stands
// for the node's CDI root.
func (n *node) containerd(text string) {
	n.write(filepath.Join(n.opts.HostRoot, n.opts.ContainerdConfig), strings.ReplaceAll(text, "CDI_ROOT", n.opts.CDIRoot))
}

// driverRoot is a driver root whose libcuda is of driver version.
func (n *node) driverRoot(version string) string {
	root := filepath.Join(n.root, "driver")
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	n.write(filepath.Join(lib, "libcuda.so."+version), "not ELF")
	if err := os.Symlink("libcuda.so."+version, filepath.Join(lib, "libcuda.so.1")); err != nil {
		n.t.Fatal(err)
	}
	return root
}

// nvidiaSpec writes NVIDIA's CDI spec for the first gpus GPUs (by index),
// mounting lib where it is set.
func (n *node) nvidiaSpec(gpus int, lib string) {
	var devs []string
	for i := range gpus {
		devs = append(devs, `{"name":"`+string(rune('0'+i))+`","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia`+string(rune('0'+i))+`"}]}}`)
	}
	edits := `{}`
	if lib != "" {
		edits = `{"mounts":[{"hostPath":"` + lib + `","containerPath":"/usr/lib/x86_64-linux-gnu/libcuda.so.1","options":["ro","bind"]}]}`
	}
	n.write(filepath.Join(n.opts.CDIRoot, "nvidia.json"), `{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[`+strings.Join(devs, ",")+`],"containerEdits":`+edits+`}`)
}

// checkpointHolding writes a checkpoint in which a claim holds group on
// gpus, with the simulated node's UUIDs.
func (n *node) checkpointHolding(group string, gpus []int) {
	_, ctx := ktesting.NewTestContext(n.t)
	host, err := n.opts.Node.OpenHost(ctx)
	if err != nil {
		n.t.Fatal(err)
	}
	defer func() { _ = host.Close() }()
	inv, err := nodesetup.Discover(ctx, host)
	if err != nil {
		n.t.Fatal(err)
	}
	st := checkpoint.New()
	dev := checkpoint.Device{Requests: []string{"gpu"}, Pool: "node-1", Device: "g01-2x", GroupDevice: "g01-2x", CDIDevice: "g01-2x-0"}
	dev.Profile, dev.Group, dev.GPUs, dev.Seats, dev.Generations = "2x", group, gpus, []int{0}, []int64{1}
	for _, x := range gpus {
		dev.GPUUUIDs = append(dev.GPUUUIDs, inv.GPUs[x].UUID)
	}
	st.Claims["0b7d9a0e-2b36-4f4e-9d5c-1f1c2c3d4e5f"] = &checkpoint.Claim{Namespace: "team-a", Name: "train", Phase: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{dev}}
	st.Generations[checkpoint.SeatKey("g01-2x", 0)] = 1
	dir := driver.PluginDir(n.opts.PluginsDir)
	n.mkdir(dir)
	if err := checkpoint.NewStore(dir).Save(st); err != nil {
		n.t.Fatal(err)
	}
	n.write(filepath.Join(n.opts.CDIRoot, "kyb.ai-gpu_0b7d9a0e-2b36-4f4e-9d5c-1f1c2c3d4e5f.json"), "{}")
}

// newerCheckpoint is a checkpoint of format v9, with its sums right.
const newerCheckpoint = `{"version":"v9","checksum":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","sum":"sha256:868313242c9f93d312784f41db771b963c03978d3da6c359a47201fa24b3d6d8","data":{}}`

func TestUnknownPCIePlacementIsAWarning(t *testing.T) {
	inv := &inventory.Inventory{
		GPUs:  []inventory.GPU{{Index: 0, NUMANode: -1}, {Index: 1, NUMANode: -1}},
		Links: [][]inventory.Link{{{}, {PCIe: inventory.PCIeSystem}}, {{PCIe: inventory.PCIeSystem}, {}}},
	}
	c := topologyCheck(inv)
	if c.Status != Warn || !strings.Contains(c.Summary, "PCIe root or NUMA node unknown for 2 GPUs") || !strings.Contains(c.Fix, "--sysfs-root") {
		t.Errorf("topology without sysfs: %+v", c)
	}
	inv.GPUs[0].NUMANode, inv.GPUs[0].PCIeRoot = 0, "pci0000:00"
	inv.GPUs[1].NUMANode, inv.GPUs[1].PCIeRoot = 1, "pci0000:80"
	if c := topologyCheck(inv); c.Status != OK || c.Details[0] != "GPU0  X     SYS" {
		t.Errorf("topology with sysfs: %+v", c)
	}
}

// blockBound is far beyond what an examination of a simulated node takes;
// a read blocked on a FIFO never ends.
const blockBound = 30 * time.Second

// A FIFO in the CDI root, named as NVIDIA's spec or as a claim's, is left
// out wherever the CDI directories are read, and the report names it;
// nothing blocks on it, --probe-claim of the claim whose spec it is
// included: that check fails, naming it.
func TestDoctorLeavesOutAFIFOInTheCDIRoot(t *testing.T) {
	const uid = types.UID("1c2d3e4f-0000-4000-8000-00000000000a")
	n, inv := probeNode(t)
	n.recordClaim(inv, uid, "G0", []int{0})
	spec, nvidia := filepath.Join(n.opts.CDIRoot, cdi.SpecName(uid)+".json"), filepath.Join(n.opts.CDIRoot, "nvidia.yaml")
	fifotest.Make(t, spec)
	fifotest.Make(t, nvidia)
	n.opts.Probe.Claim = uid
	var r *Report
	if !fifotest.Returns(t, blockBound, func() { r = n.run(t) }, spec, nvidia) {
		t.Fatalf("the doctor blocked on a FIFO in the CDI root (%s, %s)", spec, nvidia)
	}
	c := check(t, r, "nvidia-cdi")
	details := strings.Join(c.Details, "\n")
	for _, p := range []string{spec, nvidia} {
		if want := "left out: read CDI spec: " + p + " is a FIFO, not a regular file"; c.Status != Warn || !strings.Contains(details, want) || c.Fix == "" {
			t.Errorf("nvidia-cdi: %s %q, want warn with %q", c.Status, details, want)
		}
	}
	if c := check(t, r, "probe"); c.Status != Fail || !strings.Contains(c.Summary, spec+" is a FIFO, not a regular file") {
		t.Errorf("probe of the claim whose spec is a FIFO: %s %q", c.Status, c.Summary)
	}
}

// A step whose read never returns (the containerd configuration is a FIFO
// here) fails its checks when --check-timeout runs out, and the doctor
// goes on with the next.
func TestAStepThatBlocksFailsItsChecksAndTheDoctorGoesOn(t *testing.T) {
	n := newNode(t)
	config := filepath.Join(n.opts.HostRoot, n.opts.ContainerdConfig)
	if err := os.Remove(config); err != nil {
		t.Fatal(err)
	}
	fifotest.Make(t, config)
	// The step left behind reads an empty file once let go.
	t.Cleanup(func() { fifotest.Release(t, config) })
	n.opts.CheckTimeout = time.Second
	var r *Report
	if !fifotest.Returns(t, blockBound, func() { r = n.run(t) }, config) {
		t.Fatalf("the doctor blocked reading %s, a FIFO", config)
	}
	c := check(t, r, "runtime-cdi")
	if want := "not finished within 1s (--check-timeout)"; c.Status != Fail || !strings.HasPrefix(c.Summary, want) || c.Fix == "" {
		t.Errorf("runtime-cdi: %s %q, want fail with %q", c.Status, c.Summary, want)
	}
	if c := check(t, r, "checkpoint"); c.Status != OK {
		t.Errorf("the check after the one that blocked: %+v", c)
	}
	if r.Counts[Fail] != 1 || len(r.Checks) != 11 {
		t.Errorf("%d checks, %v; want 11, 1 failed", len(r.Checks), r.Counts)
	}
}
