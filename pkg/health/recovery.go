package health

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// Beside the rules that read XIDs and probes, a driver that reports a GPU
// recovery action (NVML's field FI_DEV_GET_GPU_RECOVERY_ACTION, r550 and
// later) says itself what a GPU needs after a fault: nothing, a GPU
// reset, a node reboot, draining peer-to-peer traffic, or both a drain and
// a reset. While it asks for anything, the GPU is unhealthy, whatever the
// XID policy and the recovery period would say: an XID that the policy
// ignores makes it unhealthy, and one whose recovery period has passed
// keeps it so. Once the driver asks for nothing again, the GPU recovers
// at its next successful probe, unless today's rules still hold it (a
// critical XID within its recovery period). The field is read at every
// XID, at every recovery-action event and at every probe. A driver that
// does not report it (NOT_SUPPORTED, or any other answer) leaves the
// rules as they were. One that stops reporting it (NOT_SUPPORTED where it
// answered before) releases the GPUs it held, at their next probe: they
// follow the rules as they would in a plugin started now, which reads
// NOT_SUPPORTED and holds nothing; a hold that nothing could release
// would keep a GPU unhealthy for as long as the plugin runs. Any other
// failed read keeps the hold: the driver may answer at the next probe,
// and until then it has not said the GPU needs nothing.

// actionNames are the reason suffixes of NVML's recovery actions, a
// valid label value each.
var actionNames = map[nvml.DeviceGpuRecoveryAction]string{
	nvml.GPU_RECOVERY_ACTION_GPU_RESET:       "gpu-reset",
	nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:     "node-reboot",
	nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:       "drain-p2p",
	nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET: "drain-and-reset",
}

// actionWords say what the driver asks for, for messages.
var actionWords = map[nvml.DeviceGpuRecoveryAction]string{
	nvml.GPU_RECOVERY_ACTION_GPU_RESET:       "a GPU reset",
	nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:     "a node reboot",
	nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:       "its peer-to-peer traffic drained",
	nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET: "its work drained and a GPU reset",
}

// actionReason is the reason (taint value) of a GPU held by its recovery
// action alone: recovery-gpu-reset, …
func actionReason(a nvml.DeviceGpuRecoveryAction) string {
	if name, ok := actionNames[a]; ok {
		return "recovery-" + name
	}
	return fmt.Sprintf("recovery-action-%d", a)
}

// describeAction is "the driver asks for a GPU reset".
func describeAction(a nvml.DeviceGpuRecoveryAction) string {
	if w, ok := actionWords[a]; ok {
		return "the driver asks for " + w
	}
	return fmt.Sprintf("the driver asks for recovery action %d", a)
}

// recoveryAction reads the recovery action the driver reports for a GPU;
// known is false where it reports none: unreported where the driver does
// not report the field (NOT_SUPPORTED), else a read that failed (a GPU
// that does not answer, which the probe finds out), which may succeed at
// the next.
func (m *Monitor) recoveryAction(ctx context.Context, gpu int, dev nvml.Device) (action nvml.DeviceGpuRecoveryAction, known, unreported bool) {
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	ret := dev.GetFieldValues(values)
	if ret == nvml.SUCCESS {
		ret = nvml.Return(values[0].NvmlReturn)
	}
	was, asked := m.recordAction(gpu, ret)
	if ret != nvml.SUCCESS {
		if !asked || was == nvml.SUCCESS {
			klog.FromContext(ctx).V(2).Info("GPU reports no recovery action; its health follows the XID policy and the recovery period alone", "gpu", gpu, "answer", m.opts.NVML.ErrorString(ret))
		}
		return 0, false, ret == nvml.ERROR_NOT_SUPPORTED
	}
	v, ok := fieldUint(values[0])
	if !ok {
		return 0, false, false
	}
	return nvml.DeviceGpuRecoveryAction(v), true, false
}

// fieldUint is a field value as an unsigned number, whichever integer
// type NVML gave it.
func fieldUint(f nvml.FieldValue) (uint64, bool) {
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.LittleEndian.Uint32(f.Value[:4])), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return binary.LittleEndian.Uint64(f.Value[:]), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.LittleEndian.Uint16(f.Value[:2])), true
	}
	return 0, false
}

// ReportsRecoveryActions tells which GPUs' drivers reported a recovery
// action when last asked.
func (h *handles) ReportsRecoveryActions() map[int]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[int]bool, len(h.actions))
	for gpu, ret := range h.actions {
		out[gpu] = ret == nvml.SUCCESS
	}
	return out
}

// recordAction records what a GPU answered when asked for its recovery
// action, and returns what it answered before (asked: it was asked).
func (h *handles) recordAction(gpu int, ret nvml.Return) (was nvml.Return, asked bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	was, asked = h.actions[gpu]
	h.actions[gpu] = ret
	return was, asked
}
