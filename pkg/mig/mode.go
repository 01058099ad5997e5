package mig

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// modeChangesAtOnce are the architectures whose MIG mode changes take
// effect at once. Ampere's wait for a GPU reset with no process on the
// GPU, which no plugin may force on a node running workloads.
var modeChangesAtOnce = []string{"hopper", "blackwell"}

// ModeChangeNeedsReset says whether a MIG mode change on a GPU of the
// architecture (as pkg/inventory names it: "ampere", "hopper", …) waits
// for a GPU reset.
func ModeChangeNeedsReset(architecture string) bool {
	return !slices.Contains(modeChangesAtOnce, architecture)
}

// ModeFix says what an administrator does before GPU i, of the
// architecture, can hold a MIG instance, given its current and pending
// MIG modes as GetMigMode answers them; "" where nothing: the GPU is in
// MIG mode, or its mode changes take effect at once and the driver turns
// MIG mode on at its first instance. The plugins read the mode once at
// start, so the fix ends with their restart.
func ModeFix(i int, architecture string, current, pending int) string {
	if current == nvml.DEVICE_MIG_ENABLE || !ModeChangeNeedsReset(architecture) {
		return ""
	}
	if pending == nvml.DEVICE_MIG_ENABLE {
		return fmt.Sprintf("MIG mode is pending: reset the GPU: drain it, then run `nvidia-smi -i %d --gpu-reset` (or reboot the node), then restart the plugin pod", i)
	}
	return fmt.Sprintf("On %s GPUs turning MIG mode on needs a GPU reset with no process on the GPU: drain the GPU, then run `nvidia-smi -i %d -mig 1` and `nvidia-smi -i %d --gpu-reset` (or reboot the node; the mode persists), then restart the plugin pod", architecture, i, i)
}
