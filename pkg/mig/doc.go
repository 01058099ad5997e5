// Package mig is the geometry of Multi-Instance GPU and the rules over
// it: which GPU-instance profiles a GPU offers, where each may sit on the
// GPU's memory slices, and whether a set of instances can exist side by
// side. It holds no NVML handle and knows nothing of Kubernetes; the
// planner, the node's prepare path, the doctor and the simulated node
// read the same Model.
//
// # Where the geometry comes from
//
// From NVML, once per GPU, where the GPUs are discovered (pkg/inventory):
// Read asks nvmlDeviceGetMigMode (ERROR_NOT_SUPPORTED: the GPU has no
// MIG), nvmlDeviceGetGpuInstanceProfileInfo for every profile index until
// ERROR_INVALID_ARGUMENT (skipping those the GPU answers
// ERROR_NOT_SUPPORTED for), and nvmlDeviceGetGpuInstancePossiblePlacements
// for each profile, through Device, the few methods of a device handle it
// needs. NVML answers all of them with MIG mode off, so every MIG GPU (A30,
// A100, H100, H200, B200, GB200, RTX PRO 6000, and those to come) has its
// geometry before its first instance, and no product name is looked up.
// The GPU's memory slices are the end of its last placement, its compute
// slices those of its largest profile. Profile names are made as
// nvidia-smi prints them (read.go says how and why). A GPU whose geometry
// NVML will not give has none, and the error says why: the call that
// failed and its answer, ErrNotCapable, a geometry the publisher's
// counters could not keep exact, or two profiles of one name.
//
// # Rules
//
// Two GPU instances conflict when their memory-slice ranges overlap (NVML
// then answers ERROR_INSUFFICIENT_RESOURCES). A profile also has a maximum
// count per GPU (one 1g+me, for instance, however many slices are free),
// and the compute slices in use never exceed the GPU's. Coexist checks the
// three without allocating anything, so that a scheduler-side check and
// the node agree.
//
// # Capability device nodes
//
// A container that uses a MIG device needs the capability device nodes of
// its GPU instance and compute instance, /dev/nvidia-caps/nvidia-cap<M>;
// the minors M are listed in /proc/driver/nvidia-caps/mig-minors, which
// ParseMinors reads.
//
// # The simulated node
//
// pkg/simnode keeps the MIG tables of the A100 (40 and 80 GB), the H100
// 80GB HBM3 and the H200 (as a real H200 answered), serves them through
// the NVML calls Read makes, and partitions its GPUs by them through the
// calls a driver makes, refusing what real NVML refuses (overlapping
// placements, a GPU instance destroyed under its compute instances, a MIG
// mode change on a busy GPU). A NodeTopology file may give any simulated
// GPU a geometry of its own. The top of pkg/simnode/mig.go lists what the
// simulation leaves out.
package mig
