package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
)

// NVML makes and destroys GPU and compute instances only for a process
// that holds the MIG config capability. It reads the capability's minor
// from /proc/driver/nvidia/capabilities/mig/config (DeviceFileMinor, 1),
// opens /dev/nvidia-caps/nvidia-cap<minor> (of the nvidia-caps major that
// /proc/devices lists, allocated when the module loads) and hands the
// open file to the driver, which checks that it is that capability. The
// driver makes the node readable by root only (DeviceFileMode 256, 0400),
// and in a container the device cgroup must allow it too, which it does
// only for a privileged one. Without it every MIG prepare fails
// (ERROR_NO_PERMISSION), while the plan and the published devices look
// right.
//
// The doctor does what NVML does short of making an instance: it reads
// the capability file and /proc/devices, stats the node and opens it for
// reading, and closes it again. Opening the node grants nothing by itself
// (only handing the file to the driver does), so the check changes
// nothing.

// migConfigCapability is the capability file NVML reads.
const migConfigCapability = "mig/config"

// checkMIGConfig adds the check of the MIG config capability, where a
// profile of the plan uses MIG.
func (e *examination) checkMIGConfig(_ context.Context) {
	if e.host == nil || e.node == nil {
		return
	}
	for _, p := range e.node.Plan.Profiles {
		if p.MIG != nil {
			e.add(migConfigCheck(e.host))
			return
		}
	}
}

// migConfigCheck checks that this process may open the MIG config
// capability's node.
func migConfigCheck(h *gpuhost.Host) Check {
	fail := func(summary, fix string, details ...string) Check {
		return Check{Name: "mig-config", Status: Fail, Summary: "the MIG config capability: " + summary, Details: details,
			Fix: fix + "; until then every prepare of a MIG seat fails (NVML answers ERROR_NO_PERMISSION)"}
	}
	capability, err := h.ReadCapability(migConfigCapability)
	if err != nil {
		fix := "the NVIDIA driver lists the capability where it supports MIG (nvidia-smi mig -lgip answers); in a container, /proc/driver/nvidia may be the NVIDIA container runtime's copy, which lacks it unless the container is privileged and asks for it: with a MIG profile the chart asks that runtime for nothing (NVIDIA_VISIBLE_DEVICES=void), so the container's /proc shows the driver's own files"
		if !errors.Is(err, fs.ErrNotExist) {
			fix = "the NVIDIA driver wrote a capability file NVML cannot read either: reload the NVIDIA modules or reboot the node"
		}
		return fail(err.Error(), fix)
	}
	major, err := h.CharMajor("nvidia-caps")
	if err != nil {
		return fail(err.Error(), "the nvidia-caps region is the NVIDIA driver's own (nvidia.ko registers it): a driver without it has no MIG capabilities; upgrade the driver")
	}
	node := capability.Node()
	want := fmt.Sprintf("%d:%d", major, capability.Minor)
	details := []string{
		fmt.Sprintf("%s: DeviceFileMinor %d, DeviceFileMode %04o", capability.File, capability.Minor, capability.Mode),
		fmt.Sprintf("%s: nvidia-caps %d", gpuhost.ProcDevices, major),
	}
	mknod := fmt.Sprintf("mknod -m %o %s c %d %d", capability.Mode, node, major, capability.Minor)
	got, err := h.StatDevice(node)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fail(node+" is missing", fmt.Sprintf("make the node on the host as the driver's tools do, nvidia-modprobe -f %s, or %s (mkdir -p /dev/nvidia-caps first); where a profile has mig, the chart mounts the host's /dev/nvidia-caps into the plugin's pod, and the pod sees a node made later (run by hand, set --dev-root to where the host's /dev is)", capability.File, mknod), details...)
	case err != nil:
		return fail(err.Error(), "the capability node cannot be examined: check --dev-root", details...)
	case !got.CharDevice():
		return fail(fmt.Sprintf("%s is not a character device (mode %s)", node, got.Mode), "on the host, remove what is at the node's path and make the node: "+mknod, details...)
	case got.Major != major || got.Minor != capability.Minor:
		return fail(fmt.Sprintf("%s is %d:%d, want %s", node, got.Major, got.Minor, want),
			fmt.Sprintf("the kernel gives nvidia-caps its major when the module loads, so a node made by hand on an earlier boot may carry another: on the host, rm %s && %s", node, mknod), details...)
	}
	details = append(details, fmt.Sprintf("%s: %s, mode %04o, owner uid %d", node, want, got.Mode.Perm(), got.UID))
	if err := h.OpenDevice(node); err != nil {
		switch {
		case errors.Is(err, syscall.EACCES):
			return fail(fmt.Sprintf("%s is not readable by this process's user (mode %04o, owner uid %d)", node, got.Mode.Perm(), got.UID),
				"the driver makes the node readable by root only: run the plugin as root (the chart does, runAsUser 0); do not widen the node's mode, which would let any process on the node make and destroy MIG instances", details...)
		case errors.Is(err, syscall.EPERM):
			return fail(fmt.Sprintf("the device cgroup refuses %s to this container", node),
				"a container that is not privileged may open only the devices its runtime gave it, and the NVIDIA container runtime gives this one (NVIDIA_MIG_CONFIG_DEVICES) only to a privileged container: run the plugin's container privileged, as the chart does where a profile has mig", details...)
		}
		return fail(fmt.Sprintf("open %s: %v", node, err), "the node cannot be opened for reading: check dmesg for the NVIDIA driver's messages", details...)
	}
	return Check{Name: "mig-config", Status: OK, Summary: fmt.Sprintf("the MIG config capability: %s (%s) opens for reading; NVML may make and destroy MIG instances", node, want), Details: details}
}
