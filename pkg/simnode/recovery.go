package simnode

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// A simulated GPU answers NVML's GPU recovery-action field
// (FI_DEV_GET_GPU_RECOVERY_ACTION, through GetFieldValues) as a driver
// that supports it does: NONE until a test or the fault-injection file
// says what the driver asks for (SetRecoveryAction), and each change is
// an event of type GpuRecoveryAction where the fault-injection file makes
// it. A GPU can answer NOT_SUPPORTED instead, as one under an older
// driver does. Every other field answers NOT_SUPPORTED: nothing here
// reads them.

// RecoveryActions names the recovery actions as the fault-injection file
// does, in NVML's numbering (nvml.GPU_RECOVERY_ACTION_NONE = 0 …).
var RecoveryActions = []string{"none", "gpu-reset", "node-reboot", "drain-p2p", "drain-and-reset"}

// ParseRecoveryAction reads a recovery action's name.
func ParseRecoveryAction(name string) (nvml.DeviceGpuRecoveryAction, error) {
	i := slices.Index(RecoveryActions, name)
	if i < 0 {
		return 0, fmt.Errorf("recovery action %q: want one of %s", name, strings.Join(RecoveryActions, ", "))
	}
	return nvml.DeviceGpuRecoveryAction(i), nil
}

// recoveryState is what a GPU's driver says of its recovery.
type recoveryState struct {
	action      nvml.DeviceGpuRecoveryAction
	unsupported bool
}

// SetRecoveryAction sets the recovery action GPU i's driver reports, as
// the driver does after an XID (and back to NONE once the GPU has been
// recovered). It sends no event: Apply's "action" does.
func (s *gpuStates) SetRecoveryAction(i int, a nvml.DeviceGpuRecoveryAction) error {
	if err := s.check(i); err != nil {
		return err
	}
	if int(a) < 0 || int(a) >= len(RecoveryActions) {
		return fmt.Errorf("recovery action %d is not NVML's", a)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.recovery[i]
	st.action = a
	s.recovery[i] = st
	return nil
}

// SetRecoveryActionSupported makes GPU i answer its recovery-action field
// (true, the default) or NOT_SUPPORTED, as under a driver too old for it.
func (s *gpuStates) SetRecoveryActionSupported(i int, supported bool) error {
	if err := s.check(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.recovery[i]
	st.unsupported = !supported
	s.recovery[i] = st
	return nil
}

// describeFields answers GetFieldValues: each value's own return code
// says whether it was read, as NVML's does.
func (s *gpuStates) describeFields(d *mock.Device, gpu int) {
	d.GetFieldValuesFunc = func(values []nvml.FieldValue) nvml.Return {
		if len(values) == 0 {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		fail := s.failure(gpu)
		s.mu.Lock()
		st := s.recovery[gpu]
		s.mu.Unlock()
		for i := range values {
			v := &values[i]
			switch {
			case fail != nvml.SUCCESS:
				v.NvmlReturn = uint32(fail)
			case v.FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION || st.unsupported:
				v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			default:
				v.NvmlReturn = uint32(nvml.SUCCESS)
				v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				v.Value = [8]byte{}
				binary.LittleEndian.PutUint32(v.Value[:4], uint32(st.action))
			}
		}
		return nvml.SUCCESS
	}
}
