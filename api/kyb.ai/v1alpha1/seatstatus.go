package v1alpha1

// SeatStatus is the data the driver writes into a ResourceClaim's
// status.devices[].data for each of its devices on a node: which seats of
// which group the device holds, with their generations. Operators and
// tools read it; a plugin that lost its checkpoint rebuilds from it. The
// plugin's checkpoint records the same fields for each device.
//
//	{"profile": "1x", "group": "G0", "gpus": [0], "gpuUUIDs": ["GPU-…"],
//	 "seats": [2], "generations": [7]}
type SeatStatus struct {
	// Profile is the profile's short name (1x, 2x-train).
	Profile string `json:"profile"`
	// Group is the group's name (G01).
	Group string `json:"group"`
	// GPUs are the group's GPU indices, and GPUUUIDs their UUIDs in the
	// same order.
	GPUs     []int    `json:"gpus"`
	GPUUUIDs []string `json:"gpuUUIDs"`
	// Seats and Generations are parallel: seat Seats[i] was handed out
	// with generation Generations[i].
	Seats       []int   `json:"seats"`
	Generations []int64 `json:"generations"`
	// AdminAccess marks a device allocated with admin access (monitoring):
	// it has the group's GPUs but holds no seat, so Seats and Generations
	// are empty, and it keeps no ordinary claim off the group.
	AdminAccess bool `json:"adminAccess,omitempty"`
	// Size, on a sized profile's group, is what the device's seat holds:
	// the capacities its allocation consumed.
	Size *SeatSize `json:"size,omitempty"`
}

// SeatSize is what a sized seat holds of its group.
//
//	{"memoryBytes": 21474836480, "computePercent": 25}
type SeatSize struct {
	// MemoryBytes is the device memory the seat's MPS client may pin on
	// each GPU of its group.
	MemoryBytes int64 `json:"memoryBytes"`
	// ComputePercent is the per cent of each GPU's SMs the client may use.
	ComputePercent int64 `json:"computePercent"`
}

// IsZero reports whether the size holds nothing (no sized seat).
func (s SeatSize) IsZero() bool { return s == SeatSize{} }

// Add is the sum of two sizes.
func (s SeatSize) Add(o SeatSize) SeatSize {
	return SeatSize{MemoryBytes: s.MemoryBytes + o.MemoryBytes, ComputePercent: s.ComputePercent + o.ComputePercent}
}

// Max is the larger memory and the larger compute of two sizes, each on
// its own.
func (s SeatSize) Max(o SeatSize) SeatSize {
	return SeatSize{MemoryBytes: max(s.MemoryBytes, o.MemoryBytes), ComputePercent: max(s.ComputePercent, o.ComputePercent)}
}
