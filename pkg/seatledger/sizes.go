package seatledger

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

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

// checkSizing refuses a seat on a group whose profile was made sized, or
// plain, while seats of the other kind are held there: the seats of one
// kind count neither in the other's sizes nor in its equal shares, so
// together they could give the GPU's memory out more than once. The group
// serves again once those seats are released.
func checkSizing(st *checkpoint.State, uid types.UID, group *planner.Group) error {
	_, sized := group.Sizes()
	groupDevice := group.DeviceName()
	for holder, c := range st.Claims {
		if holder == uid {
			continue
		}
		for _, d := range c.Devices {
			if d.GroupDevice != groupDevice || d.AdminAccess || d.Fenced || (d.Size != nil) == sized {
				continue
			}
			then, now := "sized", "plain"
			if sized {
				then, now = "plain", "sized"
			}
			return fmt.Errorf("group %s is %s now, and claim %s holds a %s seat of its earlier configuration there: no seat of the group is handed out until that claim is released", group.Name, now, describeClaim(st, holder), then)
		}
	}
	return nil
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
