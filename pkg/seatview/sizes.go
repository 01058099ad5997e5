package seatview

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// A sized profile's group is one device with consumable capacities memory
// (bytes on each GPU of the group) and compute (per cent of each GPU's
// SMs) beside seats, each with a request policy whose default a claim
// that asks nothing consumes (docs/design.md, "Sized seats"). The names
// are the plugin's (pkg/draresources), repeated here so that kubectl-kyb
// links none of the node's code.
const (
	memoryCapacity  = "memory"
	computeCapacity = "compute"
)

// Sizes is a sized group's memory and compute: what its device publishes
// and what the claims allocated there consumed.
type Sizes struct {
	// MemoryBytes is the group's device memory on each of its GPUs;
	// HeldMemoryBytes what the claims allocated there consumed of it;
	// FreeMemoryBytes what is left for new claims: none where the group
	// takes no new claim (full, blocked or unhealthy). A request is
	// rounded up to the profile's step, so the last bytes below a step
	// are no size a claim can get.
	MemoryBytes     int64 `json:"memoryBytes"`
	HeldMemoryBytes int64 `json:"heldMemoryBytes"`
	FreeMemoryBytes int64 `json:"freeMemoryBytes"`
	// ComputePercent is the group's SMs in per cent of each GPU's (100),
	// held and free as memory is.
	ComputePercent     int64 `json:"computePercent"`
	HeldComputePercent int64 `json:"heldComputePercent"`
	FreeComputePercent int64 `json:"freeComputePercent"`

	// def is what a claim whose allocation names no memory or compute
	// consumed: the policies' defaults, as the node counts it. least is the
	// least a claim consumes: the policies' minimum.
	def, least v1alpha1.SeatSize
}

// ProfileSizes adds a sized profile's memory and compute up over its
// groups on the nodes shown. Memory is per GPU of the profile's groups.
type ProfileSizes struct {
	Profile string `json:"profile"`
	// FreeMemoryBytes is the memory free on the groups that take new
	// claims; LargestFreeMemoryBytes the most free on one of them, the
	// largest memory one claim can get now; MemoryBytes all of it.
	FreeMemoryBytes        int64 `json:"freeMemoryBytes"`
	LargestFreeMemoryBytes int64 `json:"largestFreeMemoryBytes"`
	MemoryBytes            int64 `json:"memoryBytes"`
	// The same of compute, in per cent of a GPU's SMs.
	FreeComputePercent        int64 `json:"freeComputePercent"`
	LargestFreeComputePercent int64 `json:"largestFreeComputePercent"`
	ComputePercent            int64 `json:"computePercent"`
}

// deviceSizes reads a sized group's capacities from its published
// device: nil where the device has no memory and compute capacity.
func deviceSizes(d resourceapi.Device) *Sizes {
	mem, memOK := d.Capacity[memoryCapacity]
	cpu, cpuOK := d.Capacity[computeCapacity]
	if !memOK || !cpuOK {
		return nil
	}
	s := &Sizes{MemoryBytes: mem.Value.Value(), ComputePercent: cpu.Value.Value()}
	s.def.MemoryBytes, s.least.MemoryBytes = policy(mem)
	s.def.ComputePercent, s.least.ComputePercent = policy(cpu)
	return s
}

// policy is a capacity's default and minimum request (1 where none is
// published: a claim consumes something).
func policy(c resourceapi.DeviceCapacity) (def, least int64) {
	least = 1
	p := c.RequestPolicy
	if p == nil {
		return 0, least
	}
	if p.Default != nil {
		def = p.Default.Value()
	}
	if p.ValidRange != nil && p.ValidRange.Min != nil {
		least = max(p.ValidRange.Min.Value(), 1)
	}
	return def, least
}

// consumed is the size an allocation result holds on a sized group: its
// consumed memory and compute, and a capacity it does not name at the
// group's default (as the allocator consumes it for a claim that asks
// nothing, and the node counts it).
func (s *Sizes) consumed(r resourceapi.DeviceRequestAllocationResult) v1alpha1.SeatSize {
	size := s.def
	if q, ok := r.ConsumedCapacity[memoryCapacity]; ok {
		size.MemoryBytes = q.Value()
	}
	if q, ok := r.ConsumedCapacity[computeCapacity]; ok {
		size.ComputePercent = q.Value()
	}
	return size
}

// hold adds a claim's size to what the group holds.
func (s *Sizes) hold(size v1alpha1.SeatSize) {
	s.HeldMemoryBytes += size.MemoryBytes
	s.HeldComputePercent += size.ComputePercent
}

// exhausted reports whether no claim fits beside those held: less memory
// or compute is left than the least a claim consumes. The group then
// takes no new claim, whatever seats it has left.
func (s *Sizes) exhausted() bool {
	return s != nil && (s.MemoryBytes-s.HeldMemoryBytes < s.least.MemoryBytes || s.ComputePercent-s.HeldComputePercent < s.least.ComputePercent)
}

// settleFree computes what is free once the group's state is known: what
// is not held, where the group takes new claims. Held sizes above the
// capacity (two schedulers, or an allocation written by hand) leave
// nothing free, never a negative size.
func (s *Sizes) settleFree(state string) {
	s.FreeMemoryBytes, s.FreeComputePercent = 0, 0
	if state == StateFree || state == StateInUse {
		s.FreeMemoryBytes = max(s.MemoryBytes-s.HeldMemoryBytes, 0)
		s.FreeComputePercent = max(s.ComputePercent-s.HeldComputePercent, 0)
	}
}

// addSizes adds a sized group to its profile's figures.
func addSizes(sizes []ProfileSizes, profile string, s *Sizes) []ProfileSizes {
	i := slices.IndexFunc(sizes, func(p ProfileSizes) bool { return p.Profile == profile })
	if i < 0 {
		sizes = append(sizes, ProfileSizes{Profile: profile})
		i = len(sizes) - 1
	}
	p := &sizes[i]
	p.MemoryBytes += s.MemoryBytes
	p.FreeMemoryBytes += s.FreeMemoryBytes
	p.LargestFreeMemoryBytes = max(p.LargestFreeMemoryBytes, s.FreeMemoryBytes)
	p.ComputePercent += s.ComputePercent
	p.FreeComputePercent += s.FreeComputePercent
	p.LargestFreeComputePercent = max(p.LargestFreeComputePercent, s.FreeComputePercent)
	return sizes
}
