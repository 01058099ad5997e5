package seatledger

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// sizeOf is the size a result on a sized group holds (nil on any other
// group), refused where the allocator could not have given it, or where,
// beside the sizes the node's claims hold on the group already (the
// claim's own earlier devices included), it would pass what the group
// publishes. The scheduler's allocator keeps a group's shares within its
// capacities; a second scheduler, or an allocation written by hand, may
// not, and the node never hands out more than it published.
func sizeOf(st *checkpoint.State, result resourceapi.DeviceRequestAllocationResult, group *planner.Group) (*v1alpha1.SeatSize, error) {
	sizes, sized := group.Sizes()
	if !sized {
		return nil, nil
	}
	size, err := draresources.ConsumedSize(result, sizes)
	if err != nil {
		return nil, err
	}
	held := heldSize(st, group.DeviceName())
	after := held.Add(size)
	if after.MemoryBytes > sizes.Memory.Capacity || after.ComputePercent > sizes.Compute.Capacity {
		return nil, fmt.Errorf("group %s: %s of memory per GPU and %d %% of compute, beside the %s and %d %% held there, are more than the group has (%s, %d %%); the scheduler counts sizes, so another claim holds more than it should",
			group.Name, quantity(size.MemoryBytes), size.ComputePercent, quantity(held.MemoryBytes), held.ComputePercent, quantity(sizes.Memory.Capacity), sizes.Compute.Capacity)
	}
	return &size, nil
}

// heldSize is the sum of the sizes the state's claims hold on a group
// device.
func heldSize(st *checkpoint.State, groupDevice string) v1alpha1.SeatSize {
	var sum v1alpha1.SeatSize
	for _, c := range st.Claims {
		for _, d := range c.Devices {
			if d.GroupDevice == groupDevice && d.Size != nil {
				sum = sum.Add(*d.Size)
			}
		}
	}
	return sum
}

func quantity(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}
