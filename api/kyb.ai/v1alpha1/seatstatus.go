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
}
