package miginstance

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// Library is the part of NVML instances are made with. go-nvml's
// nvml.Interface has it, and so does the simulated node; every further
// call goes through the handles it returns.
type Library interface {
	DeviceGetHandleByIndex(index int) (nvml.Device, nvml.Return)
}

// nvmlError is a failed NVML call, named with its code so that a caller
// (and the message a user reads) can tell ERROR_INSUFFICIENT_RESOURCES
// from the rest.
type nvmlError struct {
	call string
	ret  nvml.Return
}

func (e *nvmlError) Error() string {
	return fmt.Sprintf("%s: %s (%s)", e.call, retName(e.ret), nvml.ErrorString(e.ret))
}

func callErr(call string, ret nvml.Return) error { return &nvmlError{call: call, ret: ret} }

// IsReturn reports whether err is an NVML call that answered ret.
func IsReturn(err error, ret nvml.Return) bool {
	var e *nvmlError
	return errors.As(err, &e) && e.ret == ret
}

// retName is the nvml.h name of the codes a MIG call answers.
func retName(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_INSUFFICIENT_RESOURCES:
		return "ERROR_INSUFFICIENT_RESOURCES"
	case nvml.ERROR_IN_USE:
		return "ERROR_IN_USE"
	case nvml.ERROR_NOT_FOUND:
		return "ERROR_NOT_FOUND"
	case nvml.ERROR_NOT_SUPPORTED:
		return "ERROR_NOT_SUPPORTED"
	case nvml.ERROR_INVALID_ARGUMENT:
		return "ERROR_INVALID_ARGUMENT"
	case nvml.ERROR_RESET_REQUIRED:
		return "ERROR_RESET_REQUIRED"
	case nvml.ERROR_NO_PERMISSION:
		return "ERROR_NO_PERMISSION"
	case nvml.ERROR_GPU_IS_LOST:
		return "ERROR_GPU_IS_LOST"
	case nvml.ERROR_UNKNOWN:
		return "ERROR_UNKNOWN"
	}
	return fmt.Sprintf("NVML error %d", int(ret))
}

// gone reports whether an answer means the instance asked for does not
// exist (any more).
func gone(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT
}

// fullCIProfile is the compute-instance profile that takes a GPU instance
// whole: as many compute slices as the GPU instance has (a 7g instance's
// is the 7-slice profile, not the 8-slice one).
func fullCIProfile(p mig.Profile) (int, error) {
	switch p.ComputeSlices {
	case 1:
		return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nil
	case 2:
		return nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nil
	case 3:
		return nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nil
	case 4:
		return nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, nil
	case 6:
		return nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, nil
	case 7:
		return nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, nil
	case 8:
		return nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE, nil
	}
	return 0, fmt.Errorf("MIG profile %s: no compute-instance profile of %d compute slices", p.Name, p.ComputeSlices)
}

// giProfileInfo describes the record's GPU-instance profile.
func giProfileInfo(dev nvml.Device, index, id int, name string) (nvml.GpuInstanceProfileInfo, error) {
	info, ret := dev.GetGpuInstanceProfileInfo(index)
	if ret != nvml.SUCCESS {
		return info, callErr(fmt.Sprintf("GetGpuInstanceProfileInfo(%s)", name), ret)
	}
	if int(info.Id) != id {
		return info, fmt.Errorf("GPU-instance profile %s (index %d): NVML says its ID is %d, not %d", name, index, info.Id, id)
	}
	return info, nil
}

// instanceAt finds the GPU instance of profile info at placement pl, if
// there is one.
func instanceAt(dev nvml.Device, info *nvml.GpuInstanceProfileInfo, pl mig.Placement) (nvml.GpuInstance, nvml.GpuInstanceInfo, bool, error) {
	gis, ret := dev.GetGpuInstances(info)
	if ret != nvml.SUCCESS {
		return nil, nvml.GpuInstanceInfo{}, false, callErr("GetGpuInstances", ret)
	}
	for _, gi := range gis {
		gInfo, ret := gi.GetInfo()
		if gone(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, gInfo, false, callErr("GpuInstance.GetInfo", ret)
		}
		if int(gInfo.Placement.Start) == pl.Start && int(gInfo.Placement.Size) == pl.Size {
			return gi, gInfo, true, nil
		}
	}
	return nil, nvml.GpuInstanceInfo{}, false, nil
}

// migDeviceUUID reads the UUID of the MIG device of compute instance ci
// in GPU instance gi. Only the parent's MIG device slots are walked (at
// most seven), not the node's.
func migDeviceUUID(dev nvml.Device, gi, ci int) (string, error) {
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return "", callErr("GetMaxMigDeviceCount", ret)
	}
	for i := range n {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			return "", callErr(fmt.Sprintf("GetMigDeviceHandleByIndex(%d)", i), ret)
		}
		g, ret := md.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return "", callErr("MigDevice.GetGpuInstanceId", ret)
		}
		c, ret := md.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return "", callErr("MigDevice.GetComputeInstanceId", ret)
		}
		if g != gi || c != ci {
			continue
		}
		uuid, ret := md.GetUUID()
		if ret != nvml.SUCCESS {
			return "", callErr("MigDevice.GetUUID", ret)
		}
		return uuid, nil
	}
	return "", fmt.Errorf("no MIG device of GPU instance %d compute instance %d among the GPU's %d MIG device slots", gi, ci, n)
}

// gpuInstance is one GPU instance on a device, whoever made it, with its
// profile's info.
type gpuInstance struct {
	gi      nvml.GpuInstance
	info    nvml.GpuInstanceInfo
	profile nvml.GpuInstanceProfileInfo
}

// GPUInstance is one GPU instance on a device, whoever made it, as
// ListGPUInstances reports it.
type GPUInstance struct {
	ID int
	// ProfileID is NVML's GPU instance profile ID (mig.Model.ProfileByID).
	ProfileID int
	Placement mig.Placement
}

// ListGPUInstances lists the GPU instances of every profile on dev, by
// ID; none where MIG mode is off. Instances destroyed while they are
// listed are left out.
func ListGPUInstances(dev nvml.Device) ([]GPUInstance, error) {
	gis, err := gpuInstances(dev)
	if err != nil {
		return nil, err
	}
	out := make([]GPUInstance, 0, len(gis))
	for _, g := range gis {
		out = append(out, GPUInstance{
			ID:        int(g.info.Id),
			ProfileID: int(g.profile.Id),
			Placement: mig.Placement{Start: int(g.info.Placement.Start), Size: int(g.info.Placement.Size)},
		})
	}
	slices.SortFunc(out, func(a, b GPUInstance) int { return a.ID - b.ID })
	return out, nil
}

// gpuInstances lists the GPU instances of every profile on dev; none
// where MIG mode is off. The profiles are walked as pkg/mig's Read walks
// them, so that every profile the plugin publishes is listed: an instance
// of one the listing missed would look gone, and its slices free.
func gpuInstances(dev nvml.Device) ([]gpuInstance, error) {
	var out []gpuInstance
	err := mig.WalkProfiles(dev, func(_ int, profile nvml.GpuInstanceProfileInfo) error {
		gis, ret := dev.GetGpuInstances(&profile)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			return errMIGModeOff
		}
		if ret != nvml.SUCCESS {
			return callErr("GetGpuInstances", ret)
		}
		for _, gi := range gis {
			info, ret := gi.GetInfo()
			if gone(ret) {
				continue
			}
			if ret != nvml.SUCCESS {
				return callErr("GpuInstance.GetInfo", ret)
			}
			out = append(out, gpuInstance{gi: gi, info: info, profile: profile})
		}
		return nil
	})
	if errors.Is(err, errMIGModeOff) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// errMIGModeOff ends gpuInstances' walk: GetGpuInstances answers
// ERROR_NOT_SUPPORTED while MIG mode is off, and there is no instance.
var errMIGModeOff = errors.New("MIG mode off")
