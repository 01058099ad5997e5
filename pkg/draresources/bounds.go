package draresources

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// The largest pool the driver publishes on a node bounds what a node may
// publish in the cluster: the chart's ResourceSlice admission policy
// refuses a slice of a pool of more slices, and kyb-scheduler's score
// leaves a larger pool to the allocator unordered, so that a node broken
// into cannot make either do work beyond what an honest node costs.
//
// The largest pool has every group size on the most GPUs a node may
// have. In the per-seat layout each seat is a device, and profiles that
// allow overprovisioning keep every group: a profile of every size at
// the most seats publishes 32 + 16 + 8 + 4 = 60 groups of 128 seats,
// 7,680 devices in 120 slices. The shared layout publishes a device per
// group and per MIG placement; with an instance of every GPU-instance
// profile NVML defines (17) at each of a GPU's memory slices (at most 8)
// on every GPU besides, at most 60 + 32 × 136 = 4,412 devices in 69
// slices, and 5 slices of counters (an H100's 25 placements: 860 in 17).
// TestTheLargestPoolIsWhatTheDriverPublishes checks these against the
// publisher's own output.
//
// Several profiles of one size are allowed and can publish more: the
// plugin refuses to start with such a configuration (CheckPoolBounds),
// and `kyb-dra-plugin plan -o resourceslices` says so, rather than have
// the admission policy refuse its slices one by one.

// MaxPoolDevices is the most devices the driver publishes in one node's
// pool.
func MaxPoolDevices() int {
	return max(perSeatDevices(), sharedDevices())
}

// MaxPoolSlices is the most slices of one node's pool the driver
// publishes.
func MaxPoolSlices() int {
	return max(ceilDiv(perSeatDevices(), MaxDevicesPerSlice), ceilDiv(sharedDevices(), MaxDevicesPerSlice)+counterSlices())
}

// largestGroups is how many groups a profile of every size forms on the
// most GPUs: groups of one size do not overlap.
func largestGroups() int {
	n := 0
	for _, size := range v1alpha1.ValidGroupSizes {
		n += planner.MaxGPUs / size
	}
	return n
}

// perSeatDevices is what the per-seat layout publishes at most: every
// group's seats.
func perSeatDevices() int { return largestGroups() * v1alpha1.MaxSeatsPerGroup }

// sharedDevices is what the shared layout publishes at most: the groups,
// and on every GPU an instance of every GPU-instance profile at each of
// its placements, which lie on distinct memory slices.
func sharedDevices() int {
	return largestGroups() + planner.MaxGPUs*nvml.GPU_INSTANCE_PROFILE_COUNT*mig.MaxMemorySlices
}

// counterSlices is how many slices the shared layout's counters take at
// most: the gpus set, and a MIG GPU's memory slices and a seat counter
// for each of its MIG profiles, whole GPUs to a set (mig.go), at most
// ResourceSliceMaxCounterSets sets to a slice.
func counterSlices() int {
	perGPU := mig.MaxMemorySlices + nvml.GPU_INSTANCE_PROFILE_COUNT
	gpusPerSet := max(1, resourceapi.ResourceSliceMaxCountersPerCounterSet/perGPU)
	sets := 1 + ceilDiv(planner.MaxGPUs, gpusPerSet)
	return ceilDiv(sets, resourceapi.ResourceSliceMaxCounterSets)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// CheckPoolBounds refuses a pool of more slices than MaxPoolSlices: the
// chart's ResourceSlice admission policy would refuse its slices one by
// one, leaving the node with part of a pool, which the allocator does not
// use. Several profiles of one size at many seats in the per-seat layout
// are the only configurations that get there.
func CheckPoolBounds(res resourceslice.DriverResources, layout Layout) error {
	for pool, p := range res.Pools {
		if n := len(p.Slices); n > MaxPoolSlices() {
			devices := 0
			for _, s := range p.Slices {
				devices += len(s.Devices)
			}
			return fmt.Errorf("the %s layout of pool %s takes %d ResourceSlices (%d devices), more than the %d of the largest pool the driver publishes on one node, which the chart's admission policy allows: configure fewer seats (seatsPerGroup) or fewer profiles of one group size", layout, pool, n, devices, MaxPoolSlices())
		}
	}
	return nil
}
