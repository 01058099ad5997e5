package containeredits

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

func numbers(p string) (int64, int64, error) {
	switch p {
	case "/dev/nvidiactl":
		return 195, 255, nil
	case "/dev/nvidia-uvm":
		return 511, 0, nil
	case "/dev/nvidia-uvm-tools":
		return 511, 1, nil
	}
	var m int64
	if _, err := fmt.Sscanf(p, "/dev/nvidia%d", &m); err != nil {
		return 0, 0, fmt.Errorf("no such device")
	}
	return 195, m, nil
}

var gpus = []inventory.GPU{
	{Index: 0, Minor: 0, UUID: "GPU-aaaa"},
	{Index: 1, Minor: 1, UUID: "GPU-bbbb"},
	{Index: 2, Minor: 3, UUID: "GPU-cccc"},
}

func TestBuildOneSeat(t *testing.T) {
	e, err := Build([]Seat{{Group: "G12", Seats: []int{2}, Generations: []int64{7}, GPUs: []inventory.GPU{gpus[2], gpus[1]}}}, Options{DeviceNumbers: numbers})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"CUDA_VISIBLE_DEVICES=GPU-bbbb,GPU-cccc", "KYB_GPU_GROUP=G12", "KYB_GPU_SEAT=2", "KYB_SEAT_GEN=7",
		"NVIDIA_VISIBLE_DEVICES=GPU-bbbb,GPU-cccc",
	}
	if !slices.Equal(e.Env, want) {
		t.Errorf("env %v, want %v", e.Env, want)
	}
	var nodes []string
	for _, d := range e.DeviceNodes {
		nodes = append(nodes, fmt.Sprintf("%s=%d:%d", d.Path, d.Major, d.Minor))
	}
	// GPU 2 has minor 3: device nodes follow minors, not indices.
	if got := strings.Join(nodes, " "); got != "/dev/nvidia1=195:1 /dev/nvidia3=195:3 /dev/nvidiactl=195:255 /dev/nvidia-uvm=511:0 /dev/nvidia-uvm-tools=511:1" {
		t.Errorf("device nodes %s", got)
	}
}

func TestBuildSeveralSeatsAndIndexNaming(t *testing.T) {
	e, err := Build([]Seat{
		{Group: "G0", Seats: []int{1}, Generations: []int64{3}, GPUs: gpus[:1]},
		{Group: "G01", Seats: []int{0, 2}, Generations: []int64{1, 5}, GPUs: gpus[:2]},
	}, Options{DeviceNumbers: numbers, VisibleDevices: v1alpha1.VisibleDevicesIndex})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0,1", "KYB_GPU_GROUP=G0,G01,G01", "KYB_GPU_SEAT=1,0,2",
		"KYB_SEAT_GEN=3,1,5", "NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb",
	}
	if !slices.Equal(e.Env, want) {
		t.Errorf("env %v, want %v", e.Env, want)
	}
	if len(e.DeviceNodes) != 5 {
		t.Errorf("GPU 0 is in both seats but must appear once: %v", e.DeviceNodes)
	}
}

func TestBuildErrors(t *testing.T) {
	if _, err := Build(nil, Options{DeviceNumbers: numbers}); err == nil {
		t.Error("no seats must be an error")
	}
	_, err := Build([]Seat{{Group: "G9", Seats: []int{0}, Generations: []int64{1}, GPUs: []inventory.GPU{{Index: 9, Minor: 300, UUID: "GPU-x"}}}},
		Options{DeviceNumbers: func(p string) (int64, int64, error) {
			if p == "/dev/nvidia300" {
				return 0, 0, fmt.Errorf("does not exist on the host")
			}
			return numbers(p)
		}})
	if err == nil || !strings.Contains(err.Error(), "device node /dev/nvidia300: does not exist") {
		t.Errorf("error %v", err)
	}
}

// fakeDriverRoot lays out a driver installation as the NVIDIA installer
// does: versioned files, soname symlinks, development symlinks, tools.
func fakeDriverRoot(t *testing.T) string {
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	bin := filepath.Join(root, "usr/bin")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ file, soname string }{
		{"libcuda.so.580.95.05", "libcuda.so.1"},
		{"libnvidia-ml.so.580.95.05", "libnvidia-ml.so.1"},
		{"libnvidia-nvvm.so.580.95.05", "libnvidia-nvvm.so.4"},
		{"libnvidia-ptxjitcompiler.so.580.95.05", "libnvidia-ptxjitcompiler.so.1"},
	} {
		if err := os.WriteFile(filepath.Join(lib, l.file), []byte("not really ELF"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(l.file, filepath.Join(lib, l.soname)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("libcuda.so.1", filepath.Join(lib, "libcuda.so")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libunrelated.so.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"nvidia-smi", "nvidia-debugdump", "ls"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestFindDriverFiles(t *testing.T) {
	root := fakeDriverRoot(t)
	df, err := FindDriverFiles(root, "/run/nvidia/driver")
	if err != nil {
		t.Fatal(err)
	}
	var mounts []string
	for _, m := range df.Mounts() {
		mounts = append(mounts, m.HostPath+" -> "+m.ContainerPath)
	}
	// Libraries by their soname links (relative, as ldconfig makes
	// them), so the mounts survive a driver upgrade.
	want := []string{
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1 -> /usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1 -> /usr/lib64/libcuda.so.1",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> /usr/lib64/libnvidia-ml.so.1",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4 -> /usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4 -> /usr/lib64/libnvidia-nvvm.so.4",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1 -> /usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1 -> /usr/lib64/libnvidia-ptxjitcompiler.so.1",
		"/run/nvidia/driver/usr/bin/nvidia-debugdump -> /usr/bin/nvidia-debugdump",
		"/run/nvidia/driver/usr/bin/nvidia-smi -> /usr/bin/nvidia-smi",
	}
	if !slices.Equal(mounts, want) {
		t.Errorf("mounts:\n%s\nwant:\n%s", strings.Join(mounts, "\n"), strings.Join(want, "\n"))
	}
	e, err := Build([]Seat{{Group: "G0", Seats: []int{0}, Generations: []int64{1}, GPUs: gpus[:1]}}, Options{DeviceNumbers: numbers, Driver: df})
	if err != nil || len(e.Mounts) != len(want) {
		t.Errorf("edits carry %d mounts, %v", len(e.Mounts), err)
	}
}

func TestFindDriverFilesEmpty(t *testing.T) {
	df, err := FindDriverFiles(t.TempDir(), "")
	if err != nil || !df.Empty() {
		t.Errorf("an empty root: %+v, %v", df, err)
	}
}

func TestContainerLibDirs(t *testing.T) {
	for arch, want := range map[string][]string{
		"amd64": {"/usr/lib/x86_64-linux-gnu", "/usr/lib64"},
		"arm64": {"/usr/lib/aarch64-linux-gnu", "/usr/lib64"},
		"s390x": {"/usr/lib64"},
	} {
		if got := containerLibDirs(arch); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", arch, got, want)
		}
	}
}

// A library whose soname link is absolute means something else on the
// host when the driver root is elsewhere there: the file itself is
// mounted.
func TestFindDriverFilesAbsoluteLink(t *testing.T) {
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib64")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libcuda.so.580.95.05"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(lib, "libcuda.so.580.95.05"), filepath.Join(lib, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	df, err := FindDriverFiles(root, "/run/nvidia/driver")
	if err != nil || len(df.Libraries) != 1 {
		t.Fatalf("%+v, %v", df, err)
	}
	if m := df.Mounts()[0]; m.HostPath != "/run/nvidia/driver/usr/lib64/libcuda.so.580.95.05" {
		t.Errorf("mount source %s, want the versioned file", m.HostPath)
	}
}

// The driver root is looked at again when it changes: a driver installed
// after the plugin started (a driver container not ready yet) and a
// driver upgraded under it are what the next container gets.
func TestDriverRootFollowsChanges(t *testing.T) {
	root := t.TempDir()
	required := NewDriverRoot(root, "", true)
	optional := NewDriverRoot(root, "", false)
	if _, err := required.Files(); err == nil || !strings.Contains(err.Error(), "no NVIDIA driver libraries under the driver root "+root) {
		t.Fatalf("an empty root that must hold the driver: %v", err)
	}
	if files, err := optional.Files(); err != nil || !files.Empty() {
		t.Fatalf("an empty optional root: %+v, %v", files, err)
	}
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	install := func(version string) {
		t.Helper()
		if err := os.MkdirAll(lib, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(lib, "libcuda.so."+version), []byte(version), 0o644); err != nil {
			t.Fatal(err)
		}
		// As ldconfig does: a new link renamed over the old one.
		tmp := filepath.Join(lib, ".libcuda.so.1.tmp")
		if err := os.Symlink("libcuda.so."+version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(lib, "libcuda.so.1")); err != nil {
			t.Fatal(err)
		}
	}
	resolved := func(d *DriverRoot) string {
		t.Helper()
		files, err := d.Files()
		if err != nil {
			t.Fatal(err)
		}
		if len(files.Libraries) != 1 {
			t.Fatalf("libraries %+v", files.Libraries)
		}
		return filepath.Base(files.Libraries[0].Resolved)
	}
	install("580.95.05")
	if got := resolved(required); got != "libcuda.so.580.95.05" {
		t.Errorf("after the driver appeared: %s", got)
	}
	if got := resolved(optional); got != "libcuda.so.580.95.05" {
		t.Errorf("after the driver appeared (optional root): %s", got)
	}
	before, _ := required.Files()
	mount := before.Mounts()[0].HostPath
	install("590.10.01")
	if err := os.Remove(filepath.Join(lib, "libcuda.so.580.95.05")); err != nil {
		t.Fatal(err)
	}
	if got := resolved(required); got != "libcuda.so.590.10.01" {
		t.Errorf("after an upgrade: %s", got)
	}
	// A spec written before the upgrade mounts the link, which leads to
	// the new driver now.
	if now, err := filepath.EvalSymlinks(mount); err != nil || filepath.Base(now) != "libcuda.so.590.10.01" {
		t.Errorf("the earlier mount source %s leads to %s, %v", mount, now, err)
	}
	// In an upgrade's window the libraries are gone: even a root that
	// need not hold the driver fails, once it did, rather than give a
	// container none.
	for _, f := range []string{"libcuda.so.1", "libcuda.so.590.10.01"} {
		if err := os.Remove(filepath.Join(lib, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := optional.Files(); err == nil {
		t.Error("an optional root that lost its driver gives containers none")
	}
}

func TestDeviceHostRoot(t *testing.T) {
	seat := []Seat{{Group: "G0", Seats: []int{0}, Generations: []int64{1}, GPUs: gpus[:1]}}
	for root, want := range map[string]string{"": "/dev/nvidia0", "/": "/dev/nvidia0", "/run/nvidia/driver": "/run/nvidia/driver/dev/nvidia0"} {
		e, err := Build(seat, Options{DeviceNumbers: numbers, DeviceHostRoot: root})
		if err != nil {
			t.Fatal(err)
		}
		if n := e.DeviceNodes[0]; n.Path != "/dev/nvidia0" || n.HostPath != want {
			t.Errorf("root %q: %s from %s, want from %s", root, n.Path, n.HostPath, want)
		}
	}
}
