package nodesetup

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/fifotest"
)

func TestOpenSaysWhatToFix(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		flags   Flags
		wantErr string
	}{
		{name: "unknown preset", flags: Flags{Simulate: "dgx-z"}, wantErr: `unknown preset "dgx-z"`},
		{name: "missing configuration", flags: Flags{Simulate: "dgx-h100", ConfigPath: filepath.Join(dir, "none.yaml")}, wantErr: "read node configuration"},
		{name: "invalid configuration, with its line", flags: Flags{Simulate: "dgx-h100", ConfigPath: write("bad.yaml", "profiles:\n- resource: kyb.ai/gpu-1x-seat\n  seatsPerGroup: 0\n")},
			wantErr: "bad.yaml:3: profiles[0].seatsPerGroup: must be at least 1, not 0"},
		{name: "configuration that does not fit the node, with its line", flags: Flags{Simulate: "single-gpu", ConfigPath: write("big.yaml", "groups:\n- {name: G01, gpus: [0, 1]}\n")},
			wantErr: "big.yaml:2: groups[0].gpus[1]: GPU 1 does not exist on this node (1 GPU)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			tt.flags.NodeName, tt.flags.DriverRoot, tt.flags.DevRoot, tt.flags.SysfsRoot = "node-1", "/", "/", "/sys"
			node, err := tt.flags.Open(ctx)
			if err == nil {
				node.Close(ctx)
				t.Fatalf("Open: no error, want %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Open: %v, want it to say %q", err, tt.wantErr)
			}
		})
	}
}

func TestOpenPlansTheNode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := Flags{NodeName: "node-1", Simulate: "nvlink-2x4", DriverRoot: "/", DevRoot: "/", SysfsRoot: "/sys"}
	node, err := f.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(ctx)
	if len(node.Inv.GPUs) != 8 || node.Host.Simulated == nil || node.Source != nil {
		t.Fatalf("opened %d GPUs, simulated %v, source %v", len(node.Inv.GPUs), node.Host.Simulated != nil, node.Source)
	}
	var sizes []int
	for _, p := range node.Plan.Profiles {
		sizes = append(sizes, p.Size)
	}
	if fmt.Sprint(sizes) != "[1 2 4]" {
		t.Errorf("default profiles of sizes %v, want [1 2 4]", sizes)
	}
}

func TestFaultsFileNeedsASimulatedNode(t *testing.T) {
	h := HealthFlags{FaultsFile: "/tmp/faults"}
	if err := h.Check(&Flags{}); err == nil || !strings.Contains(err.Error(), "--simulate-faults-file needs --simulate") {
		t.Errorf("real node: %v", err)
	}
	if err := h.Check(&Flags{Simulate: "dgx-h100"}); err != nil {
		t.Errorf("simulated node: %v", err)
	}
}

// driverRoot lays out the files of a driver installation under a
// directory, as the NVIDIA installer does.
func driverRoot(t *testing.T) string {
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libcuda.so.580.95.05"), []byte("not really ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libcuda.so.580.95.05", filepath.Join(lib, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	return root
}

// nvidiaSpec writes NVIDIA's CDI spec for GPUs 0..n-1, named by index,
// into dir.
func nvidiaSpec(t *testing.T, dir string, n int) {
	var b bytes.Buffer
	b.WriteString("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n")
	for i := range n {
		fmt.Fprintf(&b, "- name: \"%d\"\n  containerEdits: {deviceNodes: [{path: /dev/nvidia%d}]}\n", i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestChooseDriverFiles(t *testing.T) {
	withSpec := t.TempDir()
	nvidiaSpec(t, withSpec, 8)
	partSpec := t.TempDir()
	nvidiaSpec(t, partSpec, 3)
	root := driverRoot(t)
	tests := []struct {
		name       string
		mode       string
		driverRoot string
		cdiRoot    string
		usable     bool
		want       string // "nvidia-cdi", "driver-root" or "none"
		wantErr    string
		// wantFilesErr is what looking at the driver's files says.
		wantFilesErr string
		wantWarning  bool
	}{
		{name: "auto on a simulated node without a driver root", mode: "auto", driverRoot: "/", cdiRoot: withSpec, usable: true, want: "none"},
		{name: "auto takes NVIDIA's spec", mode: "auto", driverRoot: root, cdiRoot: withSpec, usable: true, want: "nvidia-cdi"},
		{name: "auto without CDI injection takes the driver root", mode: "auto", driverRoot: root, cdiRoot: withSpec, usable: false, want: "driver-root"},
		{name: "auto with a spec for some GPUs only takes the driver root", mode: "auto", driverRoot: root, cdiRoot: partSpec, usable: true, want: "driver-root"},
		{name: "auto with neither warns", mode: "auto", driverRoot: t.TempDir(), cdiRoot: t.TempDir(), usable: true, want: "none", wantWarning: true},
		{name: "nvidia-cdi without a spec", mode: "nvidia-cdi", driverRoot: root, cdiRoot: partSpec, usable: true, wantErr: "--driver-files=nvidia-cdi: NVIDIA's CDI spec (nvidia.com/gpu) covers 3 of 8 GPUs"},
		{name: "driver-root without libraries yet", mode: "driver-root", driverRoot: t.TempDir(), cdiRoot: withSpec, usable: true, want: "driver-root", wantFilesErr: "no NVIDIA driver libraries under the driver root"},
		{name: "driver-root", mode: "driver-root", driverRoot: root, cdiRoot: withSpec, usable: true, want: "driver-root"},
		{name: "none", mode: "none", driverRoot: root, cdiRoot: withSpec, usable: true, want: "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			src := Flags{NodeName: "node-1", Simulate: "dgx-h100", DriverRoot: tt.driverRoot, DevRoot: "/", SysfsRoot: "/sys"}
			node, err := src.Open(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer node.Close(ctx)
			flags := DriverFilesFlags{Mode: cli.NewOneOf(tt.mode, DriverFilesAuto, DriverFilesNVIDIACDI, DriverFilesDriverRoot, DriverFilesNone)}
			got, err := flags.ChooseDriverFiles(ctx, node, &src, tt.cdiRoot, tt.usable)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ChooseDriverFiles: %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Mode != tt.want {
				t.Errorf("chose %s, want %s", got.Mode, tt.want)
			}
			switch got.Mode {
			case DriverFilesNVIDIACDI:
				if id := got.NVIDIACDI(5, node.Inv.GPUs[5].UUID); id != "nvidia.com/gpu=5" {
					t.Errorf("NVIDIA's device of GPU 5: %q", id)
				}
			case DriverFilesDriverRoot:
				files, err := got.Source().Files()
				switch {
				case tt.wantFilesErr != "":
					if err == nil || !strings.Contains(err.Error(), tt.wantFilesErr) {
						t.Errorf("driver files: %v, want %q", err, tt.wantFilesErr)
					}
				case err != nil || files.Empty():
					t.Errorf("driver files without libraries: %v", err)
				}
			case DriverFilesNone:
				if got.Source() != nil {
					t.Error("no driver files, yet a source of them")
				}
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if warned := strings.Contains(logs, `warning="no NVIDIA CDI spec and no driver libraries found`); warned != tt.wantWarning {
				t.Errorf("warned %v, want %v:\n%s", warned, tt.wantWarning, logs)
			}
		})
	}
}

// A driver container makes the device nodes under its root: the plugin
// reads their numbers there, and specs name them there on the host.
func TestDeviceNodesUnderTheDriverRoot(t *testing.T) {
	withDev := t.TempDir()
	if err := os.MkdirAll(filepath.Join(withDev, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withDev, "dev/nvidiactl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                         string
		driverRoot, devRoot, hostDrv string
		wantDevRoot, wantHostRoot    string
	}{
		{name: "host driver", driverRoot: "/", devRoot: "/", wantDevRoot: "/", wantHostRoot: "/"},
		{name: "driver root without device nodes", driverRoot: t.TempDir(), devRoot: "/", wantDevRoot: "/", wantHostRoot: "/"},
		{name: "driver container's device nodes", driverRoot: withDev, devRoot: "/", wantDevRoot: withDev, wantHostRoot: withDev},
		{name: "driver root elsewhere on the host", driverRoot: withDev, devRoot: "/", hostDrv: "/run/nvidia/driver", wantDevRoot: withDev, wantHostRoot: "/run/nvidia/driver"},
		{name: "--dev-root wins", driverRoot: withDev, devRoot: "/host", hostDrv: "/run/nvidia/driver", wantDevRoot: "/host", wantHostRoot: "/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Flags{DriverRoot: tt.driverRoot, DevRoot: tt.devRoot}
			if got := f.devRoot(); got != tt.wantDevRoot {
				t.Errorf("dev root %s, want %s", got, tt.wantDevRoot)
			}
			if got := f.DeviceHostRoot(tt.hostDrv); got != tt.wantHostRoot {
				t.Errorf("device host root %s, want %s", got, tt.wantHostRoot)
			}
		})
	}
}

// A FIFO among the files of NVIDIA's spec directories, named as a spec,
// would block the choice for ever (a FIFO with no writer blocks its
// reader), and with it the plugin's start: it is left out with a warning
// naming it, and NVIDIA's spec beside it is taken.
func TestChooseDriverFilesLeavesOutAFIFO(t *testing.T) {
	cdiRoot := t.TempDir()
	nvidiaSpec(t, cdiRoot, 8)
	fifo := filepath.Join(cdiRoot, "nvidia-other.json")
	fifotest.Make(t, fifo)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	src := Flags{NodeName: "node-1", Simulate: "dgx-h100", DriverRoot: driverRoot(t), DevRoot: "/", SysfsRoot: "/sys"}
	node, err := src.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(ctx)
	flags := DriverFilesFlags{Mode: cli.NewOneOf(DriverFilesNVIDIACDI, DriverFilesAuto, DriverFilesNVIDIACDI, DriverFilesDriverRoot, DriverFilesNone)}
	var got DriverFiles
	if !fifotest.Returns(t, 20*time.Second, func() { got, err = flags.ChooseDriverFiles(ctx, node, &src, cdiRoot, true) }, fifo) {
		t.Fatalf("ChooseDriverFiles blocked on %s, a FIFO", fifo)
	}
	if err != nil || got.Mode != DriverFilesNVIDIACDI {
		t.Fatalf("chose %q, %v; want nvidia-cdi", got.Mode, err)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if want := `CDI spec left out warning="read CDI spec: ` + fifo + ` is a FIFO, not a regular file"`; !strings.Contains(logs, want) {
		t.Errorf("no warning %s in the logs:\n%s", want, logs)
	}
}
