package placement

import (
	"math"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// Sized seats (docs/design.md, "Sized seats"): a sized profile's group is
// one shared device with the consumable capacities memory (bytes, per GPU
// of the group) and compute (per cent of its SMs) beside seats, each with
// a request policy. A claim asks a size, or gets the default; the
// allocator rounds what it asks up to the policy's next step and takes
// the first group, in the slice's order, whose shares leave room for it.
//
// The score counts what each sized group's shares consume (the allocated
// state keeps it by device, in-flight allocations included), predicts the
// group a sized claim gets with the allocator's arithmetic
// (v1alpha1.SizeRule.Consumed), and under pack prefers the group, and
// the node, where the claim leaves the least memory: first fit over
// groups ordered by what they have left is best fit.

// The capacities of a sized group (pkg/draresources; a test keeps them
// equal to the driver's own).
const (
	memoryCapacity  resourceapi.QualifiedName = "memory"
	computeCapacity resourceapi.QualifiedName = "compute"
)

// sizedCapacities are a sized group's memory and compute, as published.
type sizedCapacities struct {
	memory, compute sizedCapacity
}

// sizedCapacity is one capacity of a sized group: its value and its
// request policy (max 0: none).
type sizedCapacity struct {
	value int64
	rule  v1alpha1.SizeRule
	max   int64
}

// allows says whether the allocator's request policy lets a share consume
// v: the default always, else within the maximum and on the step.
func (c sizedCapacity) allows(v int64) bool {
	return v == c.rule.Default || ((c.max == 0 || v <= c.max) && c.rule.Allows(v))
}

// parseSized reads a device's sized capacities: nil unless it publishes
// memory and compute, each with a default, a minimum and a step, all
// whole numbers. A device the driver publishes otherwise is no sized
// group, and a claim's size is not predicted there (Filter still judges).
func parseSized(api *resourceapi.Device) *sizedCapacities {
	mem, ok := parseSizedCapacity(api.Capacity[memoryCapacity])
	if !ok {
		return nil
	}
	cpu, ok := parseSizedCapacity(api.Capacity[computeCapacity])
	if !ok {
		return nil
	}
	return &sizedCapacities{memory: mem, compute: cpu}
}

func parseSizedCapacity(c resourceapi.DeviceCapacity) (sizedCapacity, bool) {
	p := c.RequestPolicy
	if p == nil || p.Default == nil || p.ValidRange == nil || p.ValidRange.Min == nil || p.ValidRange.Step == nil {
		return sizedCapacity{}, false
	}
	var out sizedCapacity
	for _, f := range []struct {
		q  *resource.Quantity
		to *int64
	}{{&c.Value, &out.value}, {p.Default, &out.rule.Default}, {p.ValidRange.Min, &out.rule.Min}, {p.ValidRange.Step, &out.rule.Step}, {p.ValidRange.Max, &out.max}} {
		if f.q == nil {
			continue
		}
		v, exact := f.q.AsInt64()
		if !exact || v < 0 {
			return sizedCapacity{}, false
		}
		*f.to = v
	}
	if out.rule.Step <= 0 {
		return sizedCapacity{}, false
	}
	return out, true
}

// asked is what a request asks of one capacity, rounded up to a whole
// unit (Quantity.Value), where it asks.
type asked struct {
	value int64
	ok    bool
}

// askedOf reads what c asks of name: the allocator matches a request's
// capacities to a device's by their names as written.
func askedOf(c *resourceapi.CapacityRequirements, name resourceapi.QualifiedName) asked {
	if c == nil {
		return asked{}
	}
	q, ok := c.Requests[name]
	if !ok {
		return asked{}
	}
	if q.CmpInt64(math.MaxInt64) > 0 {
		return asked{value: math.MaxInt64, ok: true}
	}
	return asked{value: q.Value(), ok: true}
}

// capacityNames are the capacities a request names: a device that
// publishes not all of them does not fit it.
func capacityNames(c *resourceapi.CapacityRequirements) []resourceapi.QualifiedName {
	if c == nil || len(c.Requests) == 0 {
		return nil
	}
	out := make([]resourceapi.QualifiedName, 0, len(c.Requests))
	for name := range c.Requests {
		out = append(out, name)
	}
	return out
}

// publishes says whether d publishes every capacity of names.
func (d *device) publishes(names []resourceapi.QualifiedName) bool {
	for _, n := range names {
		if _, ok := d.api.Capacity[n]; !ok {
			return false
		}
	}
	return true
}

// smallest is the least a share of any of our devices takes: one seat,
// of a sized group its minimum memory and compute. A device without room
// for it is full, and the device order puts it last.
var smallest = alternative{count: 1, seats: 1, memory: asked{ok: true}, compute: asked{ok: true}}

// size is what alt consumes of the sized group s: its memory and compute
// after the allocator's rounding, and whether the policies allow them.
func (s *sizedCapacities) size(alt *alternative) (memory, compute int64, ok bool) {
	memory = s.memory.rule.Consumed(alt.memory.value, alt.memory.ok)
	compute = s.compute.rule.Consumed(alt.compute.value, alt.compute.ok)
	return memory, compute, s.memory.allows(memory) && s.compute.allows(compute)
}

// sizeFits says whether the sized group i has room for alt beside what its
// shares consume. A share takes exactly one of its seats (the seats
// policy's validValues: [1]); the seats left are checked with the group's
// other seats.
func (u *nodeUse) sizeFits(i int, s *sizedCapacities, alt *alternative) bool {
	if alt.seats != 1 {
		return false
	}
	memory, compute, ok := s.size(alt)
	return ok && memory <= s.memory.value-u.memory[i] && compute <= s.compute.value-u.compute[i]
}

// leftMiB is the memory, in MiB, left on the sized groups among picked
// (each once) under u: what pack leaves the least of.
func leftMiB(p *pool, u *nodeUse, picked []int) (left int64, sized int) {
	for k, i := range picked {
		d := p.devices[i]
		if d.sized == nil || containsBefore(picked, k) {
			continue
		}
		sized++
		left += max(d.sized.memory.value-u.memory[i], 0) >> 20
	}
	return left, sized
}

// containsBefore says whether picked[k] is among picked[:k].
func containsBefore(picked []int, k int) bool {
	for _, i := range picked[:k] {
		if i == picked[k] {
			return true
		}
	}
	return false
}
