// Package mig is the geometry of Multi-Instance GPU as data, and the rules
// over it: which GPU-instance profiles a GPU model offers, where each may
// sit on the GPU's eight memory slices, and whether a set of instances can
// exist side by side. It knows nothing of NVML handles or of Kubernetes;
// the planner, the node's prepare path and the simulated node all read
// the same tables.
//
// # Where the figures come from
//
// The profile IDs, names, slice counts, instance maxima and placements are
// what `nvidia-smi mig -lgip` and `nvidia-smi mig -lgipp` print on the
// models listed here, and what NVML's nvmlDeviceGetGpuInstanceProfileInfo
// and nvmlDeviceGetGpuInstancePossiblePlacements answer with; the MIG user
// guide's "Supported MIG Profiles" tables agree. Memory is in MiB as
// NVML reports it (nvidia-smi prints it in GiB to two decimals). SM counts
// differ between Ampere and Hopper although the slice geometry is the
// same. H100 PCIe/NVL boards have fewer SMs than the SXM H100 and are not
// the H100-80GB model here; H100-94GB, H200-141GB, A30 and Blackwell boards
// are left out until their tables are checked against real captures.
//
// # Rules
//
// Two GPU instances conflict when their memory-slice ranges overlap (NVML
// then answers ERROR_INSUFFICIENT_RESOURCES). A profile also has a maximum
// count per GPU (one 1g+me, for instance, however many slices are free),
// and the compute slices in use never exceed seven. Coexist checks the
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
// pkg/simnode partitions its A100 and H100 GPUs with these tables through
// the NVML calls a driver makes, and refuses what real NVML refuses
// (overlapping placements, a GPU instance destroyed under its compute
// instances, a MIG mode change on a busy GPU). It does not model
// processes inside MIG devices, NVML's own choice of compute-instance
// placements, or media and copy engines; the top of pkg/simnode/mig.go
// has the list.
package mig
