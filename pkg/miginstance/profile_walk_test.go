package miginstance_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
)

// A driver newer than go-nvml v0.13.0-1 describes a profile at an index
// past the 17 that release knows (go-nvml v0.13.4-1 adds
// NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX, index 17). pkg/mig's Read walks
// the indices until ERROR_INVALID_ARGUMENT, as nvml.h asks, so the plugin
// publishes that profile and makes its instances; the listing every
// survey, adoption and lost-instance check runs must then see those
// instances too, or a made instance looks gone (its claim's device is
// tainted) and its memory slices look free.
func TestInstancesOfAProfilePastIndex16AreListed(t *testing.T) {
	const index, id = 17, 31
	info := nvml.GpuInstanceProfileInfo{Id: id, SliceCount: 3, InstanceCount: 2, MultiprocessorCount: 60, MemorySizeMB: 71424}
	whole := nvml.GpuInstanceProfileInfo{Id: 0, SliceCount: 7, InstanceCount: 1, MultiprocessorCount: 132, MemorySizeMB: 143360}
	gi := &mock.GpuInstance{GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
		return nvml.GpuInstanceInfo{Id: 2, ProfileId: id, Placement: nvml.GpuInstancePlacement{Start: 4, Size: 4}}, nvml.SUCCESS
	}}
	dev := &mock.Device{
		GetMigModeFunc: func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS },
		GetGpuInstanceProfileInfoFunc: func(i int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
			switch {
			case i == nvml.GPU_INSTANCE_PROFILE_7_SLICE:
				return whole, nvml.SUCCESS
			case i == index:
				return info, nvml.SUCCESS
			case i > index:
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		},
		GetGpuInstancePossiblePlacementsFunc: func(p *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
			switch p.Id {
			case id:
				return []nvml.GpuInstancePlacement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}, nvml.SUCCESS
			case whole.Id:
				return []nvml.GpuInstancePlacement{{Start: 0, Size: 8}}, nvml.SUCCESS
			}
			return nil, nvml.ERROR_INVALID_ARGUMENT
		},
		GetGpuInstancesFunc: func(p *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
			if p.Id == id {
				return []nvml.GpuInstance{gi}, nvml.SUCCESS
			}
			return nil, nvml.SUCCESS
		},
	}
	m, err := mig.Read(dev, "NVIDIA Next", 150754820096)
	if err != nil {
		t.Fatalf("pkg/mig reads no geometry: %v", err)
	}
	if _, err := m.ProfileByID(id); err != nil {
		t.Fatalf("pkg/mig does not read the profile at index %d: %v", index, err)
	}
	gis, err := miginstance.ListGPUInstances(dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(gis) != 1 || gis[0].ProfileID != id {
		t.Errorf("ListGPUInstances = %+v; want GPU instance 2 of profile ID %d (index %d), which pkg/mig publishes", gis, id, index)
	}
}
