package simnode

import (
	"errors"
	"io/fs"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

func h200MajorsNode(t *testing.T) *Node {
	t.Helper()
	src, err := PresetSource("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	topo, err := v1alpha1.LoadNodeTopology(append(src, "uvmMajor: 238\ncapsMajor: 241\n"...), "h200-majors.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return New(topo, "node-1")
}

// The node lists its majors in /proc/devices among other drivers', and
// its /dev holds nodes of those numbers.
func TestProcDevicesListsTheTopologysMajors(t *testing.T) {
	n := h200MajorsNode(t)
	raw, err := n.ProcFile("/proc/devices")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, want := range []string{"Character devices:\n", "\n195 nvidia-frontend\n", "\n238 nvidia-uvm\n", "\n241 nvidia-caps\n", "nvidia-caps-imex-channels\n", "\nBlock devices:\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("/proc/devices lacks %q:\n%s", want, text)
		}
	}
	// The other NVIDIA modules' majors are their own.
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[1], "nvidia") && f[1] != "nvidia-uvm" && f[1] != "nvidia-caps" && f[1] != "nvidia-frontend" && (f[0] == "238" || f[0] == "241" || f[0] == "195") {
			t.Errorf("%s shares a major with the UVM, caps or GPU nodes", line)
		}
	}
	tests := []struct {
		path         string
		major, minor int64
		mode         fs.FileMode
	}{
		{"/dev/nvidia7", 195, 7, 0o666},
		{"/dev/nvidiactl", 195, 255, 0o666},
		{"/dev/nvidia-uvm", 238, 0, 0o666},
		{"/dev/nvidia-uvm-tools", 238, 1, 0o666},
		{"/dev/nvidia-caps/nvidia-cap1", 241, 1, 0o400},
		{"/dev/nvidia-caps/nvidia-cap2", 241, 2, 0o444},
		{"/dev/nvidia-caps/nvidia-cap21", 241, 21, 0o444},
	}
	for _, tt := range tests {
		f, err := n.StatDevice(tt.path)
		if err != nil || f.Major != tt.major || f.Minor != tt.minor || f.Mode != fs.ModeDevice|fs.ModeCharDevice|tt.mode || f.UID != 0 {
			t.Errorf("%s: %+v, %v; want %d:%d, mode %o, root's", tt.path, f, err, tt.major, tt.minor, tt.mode)
		}
	}
	for _, p := range []string{"/dev/nvidia8", "/dev/nvidia-caps/nvidia-cap0", "/dev/nvidia-caps/nvidia-cap01", "/dev/nvidia-cap1", "/dev/nvidia-modeset"} {
		if _, err := n.StatDevice(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want it missing", p, err)
		}
	}
	for name, want := range map[string]string{
		"/proc/driver/nvidia/capabilities/mig/config":  "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
		"/proc/driver/nvidia/capabilities/mig/monitor": "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
	} {
		if got, err := n.ProcFile(name); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
}

func TestTopologyRefusesSharedMajors(t *testing.T) {
	src, err := PresetSource("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	for extra, want := range map[string]string{
		"uvmMajor: 241\ncapsMajor: 241\n": "capsMajor: 241 is already uvmMajor",
		"capsMajor: 195\n":                "capsMajor: 195 is already the NVIDIA driver's own major",
	} {
		if _, err := v1alpha1.LoadNodeTopology(append(src, extra...), "t.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", extra, err, want)
		}
	}
}

// A process opens a node as the kernel lets it: by the node's mode for
// its user, and by its device cgroup.
func TestOpenDevice(t *testing.T) {
	n := h200MajorsNode(t)
	if err := n.OpenDevice("/dev/nvidia-caps/nvidia-cap1"); err != nil {
		t.Errorf("root opens cap1: %v", err)
	}
	n.SetProcessUID(1000)
	if err := n.OpenDevice("/dev/nvidia-caps/nvidia-cap1"); !errors.Is(err, syscall.EACCES) || !errors.Is(err, fs.ErrPermission) {
		t.Errorf("uid 1000 opens cap1 (0400, root's): %v, want EACCES", err)
	}
	if err := n.OpenDevice("/dev/nvidia-caps/nvidia-cap2"); err != nil {
		t.Errorf("uid 1000 opens cap2 (0444): %v", err)
	}
	n.SetProcessUID(0)
	n.DenyDevice("/dev/nvidia-caps/nvidia-cap1")
	if err := n.OpenDevice("/dev/nvidia-caps/nvidia-cap1"); !errors.Is(err, syscall.EPERM) {
		t.Errorf("a denied node opens: %v, want EPERM", err)
	}
	n.SetDevice("/dev/nvidia-caps/nvidia-cap2", nil)
	if err := n.OpenDevice("/dev/nvidia-caps/nvidia-cap2"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a removed node opens: %v", err)
	}
	if _, _, err := n.DeviceNumbers("/dev/nvidia-caps/nvidia-cap2"); err == nil {
		t.Error("a removed node has numbers")
	}
}

// NVML makes and destroys instances only for a process that may open the
// MIG config capability; reading what exists needs no capability.
func TestMIGInstancesNeedTheConfigCapability(t *testing.T) {
	n := h200MajorsNode(t)
	d, ret := n.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if activation, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); activation != nvml.SUCCESS || ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v, %v", activation, ret)
	}
	info, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1})
	if ret != nvml.SUCCESS {
		t.Fatalf("root: CreateGpuInstanceWithPlacement: %v", ret)
	}
	n.SetProcessUID(1000)
	if _, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 1, Size: 1}); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("uid 1000: CreateGpuInstanceWithPlacement: %v, want ERROR_NO_PERMISSION", ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatalf("uid 1000 reads a compute instance profile: %v", ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("uid 1000: CreateComputeInstance: %v, want ERROR_NO_PERMISSION", ret)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("uid 1000: GpuInstance.Destroy: %v, want ERROR_NO_PERMISSION", ret)
	}
	if gis, ret := d.GetGpuInstances(&info); ret != nvml.SUCCESS || len(gis) != 1 {
		t.Errorf("uid 1000 lists %d GPU instances, %v; want the one", len(gis), ret)
	}
	n.SetProcessUID(0)
	n.DenyDevice("/dev/nvidia-caps/nvidia-cap1")
	if ret := gi.Destroy(); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("a container denied cap1: GpuInstance.Destroy: %v, want ERROR_NO_PERMISSION", ret)
	}
}
