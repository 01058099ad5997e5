package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

// FakeDriver is a stand-in NVIDIA driver root for a simulated node:
// libcuda.so.<version>, built from the doctor's fake CUDA library, and the
// soname link libcuda.so.1 to it, laid out as the driver installs them,
// and the device nodes under its dev/, as a driver container makes them.
// The library knows the node's GPUs by device minor, as the real driver
// does, and sees those whose device nodes the container has; so a CUDA
// probe in a container fails for the reasons it would over the real one.
type FakeDriver struct {
	Root string
	// node and preset name the simulated node whose GPUs it knows.
	node, preset string
}

// fakeCUDASource is the fake library's C source.
func fakeCUDASource() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "pkg", "doctor", "testdata", "fakecuda.c")
}

// makeDeviceNodes makes the GPUs' device nodes under the driver root, as
// a driver container does, with the simulated kernel's numbers: the
// kubelet's device manager has a runtime stat a device's host path, so
// the shim's envvar injection needs them on the host.
func (d *FakeDriver) makeDeviceNodes(numbers func(string) (int64, int64, error), paths []string) error {
	if err := os.MkdirAll(filepath.Join(d.Root, "dev"), 0o755); err != nil {
		return err
	}
	for _, p := range paths {
		major, minor, err := numbers(p)
		if err != nil {
			return err
		}
		node := filepath.Join(d.Root, p)
		if _, err := os.Lstat(node); err == nil {
			continue
		}
		if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(uint32(major), uint32(minor)))); err != nil {
			return fmt.Errorf("make %s: %w", node, err)
		}
		// As the driver makes them, whatever the umask: the runtime gives
		// the container the host node's mode.
		if err := os.Chmod(node, 0o666); err != nil {
			return err
		}
	}
	return nil
}

// NewFakeDriver makes an empty driver root in dir for the node.
func NewFakeDriver(dir, node, preset string) (*FakeDriver, error) {
	root := filepath.Join(dir, "driver")
	if err := os.MkdirAll(filepath.Join(root, "usr/lib/x86_64-linux-gnu"), 0o755); err != nil {
		return nil, err
	}
	return &FakeDriver{Root: root, node: node, preset: preset}, nil
}

// Install installs driver version (such as 580.95.05), whose CUDA driver
// API version is api (cuDriverGetVersion), as an upgrade does: the new
// library, the soname link renamed over the old one, the old library
// removed.
func (d *FakeDriver) Install(ctx context.Context, version string, api int) error {
	flags := nodesetup.Flags{NodeName: d.node, Simulate: d.preset, DriverRoot: "/", DevRoot: "/", SysfsRoot: "/sys"}
	host, err := flags.OpenHost(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = host.Close() }()
	inv, err := nodesetup.Discover(ctx, host)
	if err != nil {
		return err
	}
	var gpus, nodes []string
	for _, g := range inv.GPUs {
		gpus = append(gpus, strconv.Itoa(g.Minor)+"="+g.UUID)
		nodes = append(nodes, "/dev/nvidia"+strconv.Itoa(g.Minor))
	}
	if err := d.makeDeviceNodes(host.DeviceNumbers, append(nodes, containeredits.ControlDevices...)); err != nil {
		return err
	}
	lib := filepath.Join(d.Root, "usr/lib/x86_64-linux-gnu")
	file := "libcuda.so." + version
	out, err := exec.CommandContext(ctx, "gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1",
		fmt.Sprintf("-DFAKE_GPUS=%q", strings.Join(gpus, ",")), "-DFAKE_DRIVER_API="+strconv.Itoa(api),
		"-o", filepath.Join(lib, file), fakeCUDASource(), "-lm").CombinedOutput()
	if err != nil {
		return fmt.Errorf("build the fake libcuda: %w\n%s", err, out)
	}
	tmp := filepath.Join(lib, ".libcuda.so.1.new")
	_ = os.Remove(tmp)
	if err := os.Symlink(file, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(lib, "libcuda.so.1")); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(lib, "libcuda.so.*.*"))
	for _, o := range old {
		if filepath.Base(o) != file {
			if err := os.Remove(o); err != nil {
				return err
			}
		}
	}
	return nil
}
