// Package gpuhost opens the node's GPU interfaces: the NVML library, the
// PCIe placement of the GPUs, and the numbers of their device nodes. On a
// real node they come from the NVIDIA driver, sysfs and /dev; on a
// simulated node (--simulate) from a simnode.Node, through the same
// interfaces, so everything above this package is the same in both.
package gpuhost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// Options say which node to open.
type Options struct {
	// Simulate is a preset name or a NodeTopology file; empty means the
	// real NVIDIA driver.
	Simulate string
	// NodeName seeds simulated GPU UUIDs.
	NodeName string
	// DriverRoot is where the NVIDIA driver's files are ("/" on most
	// hosts, /run/nvidia/driver with the GPU operator's driver container).
	DriverRoot string
	// DevRoot is where the host's /dev is visible to the plugin ("/").
	DevRoot string
	// SysfsRoot is where the host's sysfs is visible to the plugin (/sys).
	SysfsRoot string
}

// Host is an opened node.
type Host struct {
	NVML nvml.Interface
	PCIe inventory.PCIeTopology
	// Simulated is the simulated node, nil on real hardware.
	Simulated *simnode.Node
	// Description says what was opened, for logs and output.
	Description string

	devRoot    string
	driverRoot string
}

// Open opens the node and initialises NVML. Close releases it.
func Open(ctx context.Context, opts Options) (*Host, error) {
	logger := klog.FromContext(ctx)
	if opts.Simulate != "" {
		node, err := simnode.Load(opts.Simulate, opts.NodeName)
		if err != nil {
			return nil, fmt.Errorf("simulated node: %w", err)
		}
		h := &Host{NVML: node.NVML(), PCIe: node.PCIe(), Simulated: node, Description: "simulated: " + opts.Simulate}
		if ret := h.NVML.Init(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("initialise simulated NVML: %v", ret)
		}
		return h, nil
	}
	libPath, err := findNVMLLibrary(opts.DriverRoot)
	if err != nil {
		return nil, err
	}
	lib := nvml.New(nvml.WithLibraryPath(libPath))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, fmt.Errorf("NVML library %s not found: is the NVIDIA driver installed (set --driver-root where it lives), or did you mean --simulate?", libPath)
		}
		return nil, fmt.Errorf("initialise NVML (%s): %s", libPath, lib.ErrorString(ret))
	}
	logger.V(2).Info("NVML initialised", "library", libPath)
	root := opts.SysfsRoot
	if root == "" {
		root = "/sys"
	}
	devRoot := opts.DevRoot
	if devRoot == "" {
		devRoot = "/"
	}
	return &Host{NVML: lib, PCIe: inventory.SysfsPCIe{Root: root}, Description: "NVML " + libPath, devRoot: devRoot, driverRoot: opts.DriverRoot}, nil
}

// Close shuts NVML down.
func (h *Host) Close() error {
	if h == nil || h.NVML == nil {
		return nil
	}
	if ret := h.NVML.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shut NVML down: %s", h.NVML.ErrorString(ret))
	}
	return nil
}

// DeviceNumbers returns the type-c major and minor of a device node such as
// /dev/nvidia0, so that a container runtime can create the node from a CDI
// spec even where the file does not exist. On a real node, the node under
// the dev root answers where the plugin sees it; else the kernel's list of
// character devices does (/proc/devices, which is not namespaced): the
// NVIDIA driver's major for the GPUs and nvidiactl, the nvidia-uvm and
// nvidia-caps modules' for theirs, and the minors the driver gives them.
// So the plugin needs no mount of the host's /dev. A simulated node's
// plugin sees none of its /dev, as the chart's pod sees none of the
// host's: its numbers come from its /proc/devices the same way, and its
// /dev only says whether it has the device.
func (h *Host) DeviceNumbers(devPath string) (int64, int64, error) {
	if h.Simulated != nil {
		if _, err := h.Simulated.StatDevice(devPath); err != nil {
			return 0, 0, fmt.Errorf("simulated node has no device %s", devPath)
		}
	} else {
		node, err := h.StatDevice(devPath)
		if err == nil {
			if node.Mode.Type() != charDevice {
				return 0, 0, fmt.Errorf("%s is not a character device", filepath.Join(h.devRoot, devPath))
			}
			return node.Major, node.Minor, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return 0, 0, err
		}
	}
	raw, err := h.ReadProcFile(ProcDevices)
	if err != nil {
		return 0, 0, fmt.Errorf("device node %s is not visible and %s cannot be read: %w", devPath, ProcDevices, err)
	}
	return NVIDIADeviceNumbers(ParseMajors(raw), ProcDevices, devPath)
}

// MIGMinorsFile lists the minors of the MIG capability device nodes.
const MIGMinorsFile = "/proc/driver/nvidia-caps/mig-minors"

// MIGMinors reads the MIG capability minors: the kernel's list, or the
// simulated node's.
func (h *Host) MIGMinors() ([]byte, error) {
	return h.ReadProcFile(MIGMinorsFile)
}

// libDirs are where distributions and the NVIDIA installer put libnvidia-ml.
var libDirs = []string{
	"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "lib/x86_64-linux-gnu",
}

func findNVMLLibrary(driverRoot string) (string, error) {
	const lib = "libnvidia-ml.so.1"
	if driverRoot == "" || driverRoot == "/" {
		// Let the dynamic loader search its usual paths.
		return lib, nil
	}
	for _, d := range libDirs {
		p := filepath.Join(driverRoot, d, lib)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found under driver root %s (looked in %v)", lib, driverRoot, libDirs)
}
