package simnode

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvml.h documents nvmlDeviceGetGpuInstancePossiblePlacements as
// "Requires privileged user" and lists NVML_ERROR_NO_PERMISSION among its
// answers; nvmlDeviceGetGpuInstanceProfileInfo asks no privilege. A
// process that is not root and whose device cgroup gives it neither MIG
// capability (the chart's pod without a MIG profile) holds no privilege
// of any kind: a simulated GPU must refuse it the placements, as the
// plugin's discovery, the doctor and the conformance suite expect a real
// one to, or every path that handles that answer is never exercised and a
// plan that works here fails on hardware.
func TestPlacementsNeedAPrivilegedProcess(t *testing.T) {
	n, d, _ := gpu0(t, "dgx-h200")
	n.SetProcessUID(1000)
	n.DenyDevice("/dev/nvidia-caps/nvidia-cap1")
	n.DenyDevice("/dev/nvidia-caps/nvidia-cap2")
	info, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetGpuInstanceProfileInfo(1_SLICE) for an unprivileged process: %v, want it answered", ret)
	}
	if pls, ret := d.GetGpuInstancePossiblePlacements(&info); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("GetGpuInstancePossiblePlacements for a non-root process without MIG capabilities: %v %v, want ERROR_NO_PERMISSION", pls, nvmlErrorString(ret))
	}
}
