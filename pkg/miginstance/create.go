package miginstance

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// create makes the instance of r, a GIIntended record the journal holds,
// writing each phase through record before the call it announces: the
// GPU instance (GIMade), its compute instance (CIIntended), and, once the
// MIG device's UUID is read, Created. On an NVML failure what was made is
// destroyed through its handles, which name exactly what this call made:
// undone says that nothing is left of it (else the journal's record stays
// for Reconcile). A crash point stops it where it is, as a crash would.
func (m *Manager) create(ctx context.Context, dev nvml.Device, info *nvml.GpuInstanceProfileInfo, r Record, record func(step string, r Record) error) (undone bool, err error) {
	if m.step("CreateGpuInstanceWithPlacement") {
		return false, errCrashed
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(info, &nvml.GpuInstancePlacement{Start: uint32(r.Start), Size: uint32(r.Size)})
	if ret != nvml.SUCCESS {
		return true, callErr("CreateGpuInstanceWithPlacement", ret)
	}
	var ci nvml.ComputeInstance
	// fail undoes what was made before err; a crash point undoes nothing.
	fail := func(err error) (bool, error) {
		if errors.Is(err, errCrashed) {
			return false, err
		}
		if uerr := m.undo(ctx, r, gi, ci); uerr != nil {
			return false, errors.Join(err, uerr)
		}
		return true, err
	}
	if m.step("GpuInstance.GetInfo") {
		return false, errCrashed
	}
	gInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return fail(callErr("GpuInstance.GetInfo", ret))
	}
	r.Phase, r.GI = GIMade, int(gInfo.Id)
	if err := record("record GPU instance", r); err != nil {
		return fail(err)
	}
	ciIndex, err := fullCIProfile(mig.Profile{Name: r.Profile, ComputeSlices: int(info.SliceCount)})
	if err != nil {
		return fail(err)
	}
	if m.step("GetComputeInstanceProfileInfo") {
		return false, errCrashed
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciIndex, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return fail(callErr("GpuInstance.GetComputeInstanceProfileInfo", ret))
	}
	r.Phase = CIIntended
	if err := record("record compute instance", r); err != nil {
		return fail(err)
	}
	if m.step("CreateComputeInstance") {
		return false, errCrashed
	}
	ci, ret = gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		ci = nil
		return fail(callErr("GpuInstance.CreateComputeInstance", ret))
	}
	if m.step("ComputeInstance.GetInfo") {
		return false, errCrashed
	}
	cInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return fail(callErr("ComputeInstance.GetInfo", ret))
	}
	if m.step("read MIG UUID") {
		return false, errCrashed
	}
	uuid, err := migDeviceUUID(dev, r.GI, int(cInfo.Id))
	if err != nil {
		return fail(err)
	}
	r.Phase, r.CI, r.UUID = Created, int(cInfo.Id), uuid
	if err := record("record created", r); err != nil {
		return fail(err)
	}
	return false, nil
}

// undo destroys the compute instance (if any) and the GPU instance a
// failed create made, through their handles.
func (m *Manager) undo(ctx context.Context, r Record, gi nvml.GpuInstance, ci nvml.ComputeInstance) error {
	if ci != nil {
		if m.step("ComputeInstance.Destroy") {
			return errCrashed
		}
		if ret := ci.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
			return fmt.Errorf("roll back: %w", callErr("ComputeInstance.Destroy", ret))
		}
	}
	if m.step("GpuInstance.Destroy") {
		return errCrashed
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
		return fmt.Errorf("roll back: %w", callErr("GpuInstance.Destroy", ret))
	}
	klog.FromContext(ctx).V(2).Info("Rolled back a MIG instance whose making failed", "instance", r.String())
	return nil
}
