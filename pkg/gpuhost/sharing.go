package gpuhost

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// SetExclusive puts a GPU in compute mode EXCLUSIVE_PROCESS (for an MPS
// daemon) or back to DEFAULT. NVML needs root for it.
func (h *Host) SetExclusive(_ context.Context, uuid string, exclusive bool) error {
	dev, ret := h.NVML.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("find GPU %s: %s", uuid, h.NVML.ErrorString(ret))
	}
	mode := nvml.COMPUTEMODE_DEFAULT
	if exclusive {
		mode = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
	}
	if ret := dev.SetComputeMode(mode); ret != nvml.SUCCESS {
		return fmt.Errorf("set the compute mode of GPU %s: %s", uuid, h.NVML.ErrorString(ret))
	}
	return nil
}

// SetTimeSlice sets the time slice of GPUs (by index). NVML has no call
// for it: on a real node it is nvidia-smi compute-policy --set-timeslice,
// run from the driver root; a simulated node records it.
func (h *Host) SetTimeSlice(ctx context.Context, gpus []int, interval v1alpha1.TimeSliceInterval) error {
	n := slices.Index(v1alpha1.TimeSliceIntervals, interval)
	if n < 0 {
		return fmt.Errorf("unknown time slice %q", interval)
	}
	for _, x := range gpus {
		if h.Simulated != nil {
			if err := h.Simulated.SetTimeSlice(x, n); err != nil {
				return fmt.Errorf("set the time slice of GPU %d: %w", x, err)
			}
			continue
		}
		args := []string{"compute-policy", "-i", strconv.Itoa(x), "--set-timeslice=" + strconv.Itoa(n)}
		cmd := h.NVIDIASMI(ctx, args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("set the time slice of GPU %d (%s): %w: %s", x, strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// NVIDIASMI is the driver's nvidia-smi with args, run with the driver
// root as its root, where its libraries are. A simulated node has none.
func (h *Host) NVIDIASMI(ctx context.Context, args ...string) *exec.Cmd {
	if h.driverRoot == "" || h.driverRoot == "/" {
		return exec.CommandContext(ctx, "nvidia-smi", args...)
	}
	return exec.CommandContext(ctx, "chroot", append([]string{h.driverRoot, "nvidia-smi"}, args...)...)
}
