package draresources

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// A sized profile's group is one shared device with three consumable
// capacities, each with a request policy (a capacity without one is taken
// whole by the first share): seats, of which each claim takes exactly one
// (validValues [1]: the allocator refuses a device to a request for more),
// memory in bytes per GPU of the group, and compute in per cent of each
// GPU's SMs, both a validRange of min and step with the group's default.
// The allocator rounds a request off the step up to the next step, gives a
// capacity the claim does not name its default, and refuses a device whose
// shares would pass a capacity's value (docs/design.md, "Sized seats").
const (
	// MemoryCapacity is a sized group's device memory, in bytes, on each
	// of its GPUs.
	MemoryCapacity resourceapi.QualifiedName = "memory"
	// ComputeCapacity is a sized group's SMs, in per cent of each GPU's.
	ComputeCapacity resourceapi.QualifiedName = "compute"
)

// sizedCapacities are the capacities of a sized group's device.
func sizedCapacities(s planner.Sizes) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	one := resource.NewQuantity(1, resource.DecimalSI)
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		SeatsCapacity: {
			Value:         *resource.NewQuantity(s.Seats, resource.DecimalSI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: one, ValidValues: []resource.Quantity{*one}},
		},
		MemoryCapacity:  rangeCapacity(s.Memory, resource.BinarySI),
		ComputeCapacity: rangeCapacity(s.Compute, resource.DecimalSI),
	}
}

func rangeCapacity(r planner.SizeRange, format resource.Format) resourceapi.DeviceCapacity {
	q := func(v int64) *resource.Quantity { return resource.NewQuantity(v, format) }
	return resourceapi.DeviceCapacity{
		Value: *q(r.Capacity),
		RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default:    q(r.Default),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q(r.Min), Step: q(r.Step)},
		},
	}
}

// GroupSizes is what a group's device publishes of its sizes; false where
// its profile is not sized.
func GroupSizes(g *planner.Group) (planner.Sizes, bool) { return g.Sizes() }

// DeviceSizes reads a published device's sizes back: its seats, memory
// and compute capacities and their policies. false where the device is
// not a sized group's (one of the three is missing, or a policy is not the
// one the driver publishes).
func DeviceSizes(d resourceapi.Device) (planner.Sizes, bool) {
	seats, ok := d.Capacity[SeatsCapacity]
	if !ok {
		return planner.Sizes{}, false
	}
	n, exact := seats.Value.AsInt64()
	mem, memOK := readRange(d.Capacity[MemoryCapacity])
	cpu, cpuOK := readRange(d.Capacity[ComputeCapacity])
	if !exact || !memOK || !cpuOK {
		return planner.Sizes{}, false
	}
	return planner.Sizes{Seats: n, Memory: mem, Compute: cpu}, true
}

func readRange(c resourceapi.DeviceCapacity) (planner.SizeRange, bool) {
	p := c.RequestPolicy
	if p == nil || p.Default == nil || p.ValidRange == nil || p.ValidRange.Min == nil || p.ValidRange.Step == nil {
		return planner.SizeRange{}, false
	}
	var r planner.SizeRange
	for _, f := range []struct {
		q  resource.Quantity
		to *int64
	}{{c.Value, &r.Capacity}, {*p.Default, &r.Default}, {*p.ValidRange.Min, &r.Min}, {*p.ValidRange.Step, &r.Step}} {
		v, exact := f.q.AsInt64()
		if !exact {
			return planner.SizeRange{}, false
		}
		*f.to = v
	}
	return r, true
}

// ConsumedSize is the size an allocation result on a sized group holds:
// the memory and compute it consumed. A capacity the result does not name
// (an allocation written by hand) counts at its default, as the allocator
// would have consumed it for a claim that asks nothing. A size the
// allocator could not have given (below the minimum, off the step, above
// the group's value, more than one seat) is an error.
func ConsumedSize(result resourceapi.DeviceRequestAllocationResult, s planner.Sizes) (v1alpha1.SeatSize, error) {
	if q, ok := result.ConsumedCapacity[SeatsCapacity]; ok && q.CmpInt64(1) != 0 {
		return v1alpha1.SeatSize{}, fmt.Errorf("device %s: consumed seats %s: a sized seat's claim takes exactly one seat", result.Device, q.String())
	}
	mem, err := consumed(result, MemoryCapacity, s.Memory)
	if err != nil {
		return v1alpha1.SeatSize{}, err
	}
	cpu, err := consumed(result, ComputeCapacity, s.Compute)
	if err != nil {
		return v1alpha1.SeatSize{}, err
	}
	return v1alpha1.SeatSize{MemoryBytes: mem, ComputePercent: cpu}, nil
}

func consumed(result resourceapi.DeviceRequestAllocationResult, name resourceapi.QualifiedName, r planner.SizeRange) (int64, error) {
	q, ok := result.ConsumedCapacity[name]
	if !ok {
		return r.Default, nil
	}
	v, exact := q.AsInt64()
	if !exact || !r.Fits(v) {
		return 0, fmt.Errorf("device %s: consumed %s %s is not a size the group offers (min %d, steps of %d, at most %d)", result.Device, name, q.String(), r.Min, r.Step, r.Capacity)
	}
	return v, nil
}
