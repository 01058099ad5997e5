package miginstance

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// A gpu is one GPU's MIG instances as an operation of the Manager reads
// and changes them, through the GPU's NVML handle: what is left of a
// record's instance (check), the making of one (create.go), and the
// destruction of one or of what a crash left of it (destroy.go). The
// Manager keeps the journal, its lock and what it records; a gpu knows
// nothing of either, and asks the test's crash point (Options.Step)
// before each call that changes something.
type gpu struct {
	dev  nvml.Device
	step func(name string) bool
}

// gpu is the GPU of NVML index i.
func (m *Manager) gpu(i int) (gpu, error) {
	dev, ret := m.opts.NVML.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return gpu{}, fmt.Errorf("GPU %d: %w", i, callErr("DeviceGetHandleByIndex", ret))
	}
	return gpu{dev: dev, step: m.step}, nil
}

// check says what is left of a Created record's instance.
func (g gpu) check(r Record) (state, nvml.GpuInstance, error) {
	gi, ok, err := recordedGI(g.dev, r)
	if err != nil || !ok {
		return vanished, nil, err
	}
	_, ret := gi.GetComputeInstanceById(r.CI)
	if gone(ret) {
		return partial, gi, nil
	}
	if ret != nvml.SUCCESS {
		return vanished, nil, callErr("GpuInstance.GetComputeInstanceById", ret)
	}
	uuid, err := migDeviceUUID(g.dev, r.GI, r.CI)
	if err != nil {
		return vanished, nil, err
	}
	if uuid != r.UUID {
		return vanished, nil, nil
	}
	return whole, gi, nil
}

// heldInstance is the Adopted record, of boot, of the instance at w's
// placement, where it is one w's seat can be.
func (g gpu) heldInstance(w Want, boot string) (Record, bool, error) {
	info, err := giProfileInfo(g.dev, w.Profile.Index, w.Profile.ID, w.Profile.Name)
	if err != nil {
		return Record{}, false, err
	}
	gi, gInfo, found, err := instanceAt(g.dev, &info, w.Placement)
	if IsReturn(err, nvml.ERROR_NOT_SUPPORTED) || err == nil && !found {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, err
	}
	r := newRecord(w, Adopted, boot)
	r.GI = int(gInfo.Id)
	ci, ok, err := wholeCI(g.dev, gi, r)
	if err != nil || !ok {
		return Record{}, false, err
	}
	if r.UUID, err = migDeviceUUID(g.dev, r.GI, int(ci.Id)); err != nil {
		return Record{}, false, err
	}
	r.CI = int(ci.Id)
	return r, true, nil
}
