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
func (g gpu) create(ctx context.Context, info *nvml.GpuInstanceProfileInfo, r Record, record func(step string, r Record) error) (undone bool, err error) {
	if g.step("CreateGpuInstanceWithPlacement") {
		return false, errCrashed
	}
	gi, ret := g.dev.CreateGpuInstanceWithPlacement(info, &nvml.GpuInstancePlacement{Start: uint32(r.Start), Size: uint32(r.Size)})
	if ret != nvml.SUCCESS {
		return true, callErr("CreateGpuInstanceWithPlacement", ret)
	}
	ci, err := g.fill(gi, info, r, record)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, errCrashed):
		// A crash point undoes nothing.
		return false, err
	}
	if uerr := g.undo(ctx, r, gi, ci); uerr != nil {
		return false, errors.Join(err, uerr)
	}
	return true, err
}

// fill records the GPU instance gi that create made, and makes and
// records the compute instance that spans it. It returns that compute
// instance once it is made (nil before), for create to undo.
func (g gpu) fill(gi nvml.GpuInstance, info *nvml.GpuInstanceProfileInfo, r Record, record func(step string, r Record) error) (nvml.ComputeInstance, error) {
	if g.step("GpuInstance.GetInfo") {
		return nil, errCrashed
	}
	gInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, callErr("GpuInstance.GetInfo", ret)
	}
	r.Phase, r.GI = GIMade, int(gInfo.Id)
	if err := record("record GPU instance", r); err != nil {
		return nil, err
	}
	ciIndex, err := fullCIProfile(mig.Profile{Name: r.Profile, ComputeSlices: int(info.SliceCount)})
	if err != nil {
		return nil, err
	}
	if g.step("GetComputeInstanceProfileInfo") {
		return nil, errCrashed
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciIndex, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return nil, callErr("GpuInstance.GetComputeInstanceProfileInfo", ret)
	}
	r.Phase = CIIntended
	if err := record("record compute instance", r); err != nil {
		return nil, err
	}
	if g.step("CreateComputeInstance") {
		return nil, errCrashed
	}
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		return nil, callErr("GpuInstance.CreateComputeInstance", ret)
	}
	if g.step("ComputeInstance.GetInfo") {
		return ci, errCrashed
	}
	cInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return ci, callErr("ComputeInstance.GetInfo", ret)
	}
	if g.step("read MIG UUID") {
		return ci, errCrashed
	}
	uuid, err := migDeviceUUID(g.dev, r.GI, int(cInfo.Id))
	if err != nil {
		return ci, err
	}
	r.Phase, r.CI, r.UUID = Created, int(cInfo.Id), uuid
	return ci, record("record created", r)
}

// undo destroys the compute instance (if any) and the GPU instance a
// failed create made, through their handles.
func (g gpu) undo(ctx context.Context, r Record, gi nvml.GpuInstance, ci nvml.ComputeInstance) error {
	if ci != nil {
		if g.step("ComputeInstance.Destroy") {
			return errCrashed
		}
		if ret := ci.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
			return fmt.Errorf("roll back: %w", callErr("ComputeInstance.Destroy", ret))
		}
	}
	if g.step("GpuInstance.Destroy") {
		return errCrashed
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
		return fmt.Errorf("roll back: %w", callErr("GpuInstance.Destroy", ret))
	}
	klog.FromContext(ctx).V(2).Info("Rolled back a MIG instance whose making failed", "instance", r.String())
	return nil
}
