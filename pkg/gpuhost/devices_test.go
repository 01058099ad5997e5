package gpuhost

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// h200Majors is a node whose kernel gave nvidia-uvm and nvidia-caps the
// majors an H200 node listed, neither of the presets'.
const h200Majors = `apiVersion: kyb.ai/v1alpha1
kind: NodeTopology
uvmMajor: 238
capsMajor: 241
defaults: {productName: NVIDIA H100 80GB HBM3, architecture: hopper, cudaComputeCapability: "9.0", memoryMiB: 81559}
gpus:
- {index: 0}
- {index: 1, minor: 3}
`

func openSimulated(t *testing.T, topology string) *Host {
	t.Helper()
	file := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(file, []byte(topology), 0o600); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	h, err := Open(ctx, Options{Simulate: file, NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// The numbers of a simulated node come from its /proc/devices, as a real
// node's do where the plugin does not see its /dev: a number assumed
// anywhere on the way differs from these.
func TestDeviceNumbersFollowTheNodesProcDevices(t *testing.T) {
	h := openSimulated(t, h200Majors)
	tests := []struct {
		path         string
		major, minor int64
	}{
		{"/dev/nvidia0", 195, 0},
		{"/dev/nvidia3", 195, 3},
		{"/dev/nvidiactl", 195, 255},
		{"/dev/nvidia-uvm", 238, 0},
		{"/dev/nvidia-uvm-tools", 238, 1},
		{"/dev/nvidia-caps/nvidia-cap1", 241, 1},
		{"/dev/nvidia-caps/nvidia-cap21", 241, 21},
	}
	for _, tt := range tests {
		major, minor, err := h.DeviceNumbers(tt.path)
		if err != nil || major != tt.major || minor != tt.minor {
			t.Errorf("%s: %d:%d %v, want %d:%d", tt.path, major, minor, err, tt.major, tt.minor)
		}
	}
	// A device the node lacks has no numbers, whatever /proc/devices says.
	if _, _, err := h.DeviceNumbers("/dev/nvidia1"); err == nil {
		t.Error("/dev/nvidia1 (no GPU has minor 1) has numbers")
	}
	if major, err := h.CharMajor("nvidia-caps"); err != nil || major != 241 {
		t.Errorf("nvidia-caps major %d, %v; want 241", major, err)
	}
	if _, err := h.CharMajor("nvidia-frontend-x"); err == nil || !strings.Contains(err.Error(), "lists no nvidia-frontend-x character major") {
		t.Errorf("a driver /proc/devices lacks: %v", err)
	}
}

// The MIG config capability is read as NVML reads it: its minor from the
// capability file, its node root's only.
func TestReadCapability(t *testing.T) {
	h := openSimulated(t, h200Majors)
	c, err := h.ReadCapability("mig/config")
	if err != nil || c.Minor != 1 || c.Mode != 0o400 || c.Node() != "/dev/nvidia-caps/nvidia-cap1" || c.File != "/proc/driver/nvidia/capabilities/mig/config" {
		t.Fatalf("mig/config: %+v, %v; want minor 1, mode 0400", c, err)
	}
	node, err := h.StatDevice(c.Node())
	if err != nil || !node.CharDevice() || node.Major != 241 || node.Minor != 1 || node.Mode.Perm() != 0o400 || node.UID != 0 {
		t.Errorf("%s: %+v, %v; want 241:1, mode 0400, root's", c.Node(), node, err)
	}
	if err := h.OpenDevice(c.Node()); err != nil {
		t.Errorf("root cannot open %s: %v", c.Node(), err)
	}
	h.Simulated.SetProcessUID(1000)
	if err := h.OpenDevice(c.Node()); !errors.Is(err, syscall.EACCES) {
		t.Errorf("uid 1000 opens %s: %v, want EACCES", c.Node(), err)
	}
	if _, err := h.ReadCapability("mig/other"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a capability the driver lacks: %v", err)
	}
}

func TestParseCapability(t *testing.T) {
	tests := []struct {
		text    string
		minor   int64
		mode    fs.FileMode
		wantErr string
	}{
		{text: "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n", minor: 1, mode: 0o400},
		{text: "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor: 2, mode: 0o444},
		{text: "DeviceFileMode: 256\n", wantErr: "names no DeviceFileMinor"},
		{text: "DeviceFileMinor: one\n", wantErr: `DeviceFileMinor "one" is not a number`},
	}
	for _, tt := range tests {
		c, err := parseCapability("/proc/driver/nvidia/capabilities/mig/config", []byte(tt.text))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: %+v, %v; want an error saying %q", tt.text, c, err, tt.wantErr)
			}
			continue
		}
		if err != nil || c.Minor != tt.minor || c.Mode != tt.mode {
			t.Errorf("%q: %+v, %v; want minor %d, mode %o", tt.text, c, err, tt.minor, tt.mode)
		}
	}
}
