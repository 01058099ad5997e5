// Package containeredits decides what a container holding seats gets: the
// environment, the device nodes and the driver's user-space files. Both
// surfaces of the driver use it: the DRA plugin writes it into a CDI spec,
// the device-plugin shim returns it from Allocate, so a container sees the
// same thing whichever one served it.
package containeredits

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// The environment variables a container holding seats gets. With several
// seats, the KYB_* variables list one entry per seat, in the same order.
const (
	EnvCUDAVisibleDevices   = "CUDA_VISIBLE_DEVICES"
	EnvNVIDIAVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvCUDADeviceOrder      = "CUDA_DEVICE_ORDER"
	EnvGroup                = "KYB_GPU_GROUP"
	EnvSeat                 = "KYB_GPU_SEAT"
	EnvGeneration           = "KYB_SEAT_GEN"
	// EnvAdminAccess is "true" in a container whose claim has admin
	// access (monitoring): it sees its groups' GPUs but holds no seat, so
	// KYB_GPU_SEAT and KYB_SEAT_GEN are not set.
	EnvAdminAccess = "KYB_ADMIN_ACCESS"
	// EnvSeatMemory and EnvSeatCompute are a sized seat's size: its
	// memory in bytes on each GPU of its group, and its per cent of their
	// SMs, one entry per seat in the order of KYB_GPU_SEAT. Set only where
	// every seat is sized.
	EnvSeatMemory  = "KYB_SEAT_MEMORY"
	EnvSeatCompute = "KYB_SEAT_COMPUTE"
)

// ControlDevices are the device nodes every CUDA process needs besides its
// GPUs' own.
var ControlDevices = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// Seat is one or more seats of one group held by a container.
type Seat struct {
	// Group is the group's name.
	Group string
	// Seats are the seat indices held on the group.
	Seats []int
	// Generations are the seats' generations, one per seat: a generation
	// changes each time a seat is handed out again.
	Generations []int64
	// GPUs are the group's GPUs.
	GPUs []inventory.GPU
	// AdminAccess: the group's GPUs for monitoring, no seat (Seats and
	// Generations empty).
	AdminAccess bool
	// MIG, for a seat on a MIG instance, is the instance; GPUs is then
	// its parent GPU.
	MIG *MIGDevice
	// Size, for a sized seat, is what each of Seats holds.
	Size *v1alpha1.SeatSize
}

// MIGDevice is a MIG instance a container is given: CUDA and the NVIDIA
// runtime name it by its UUID (MIG-…), and the kernel lets a process use
// it only through the capability device nodes of its GPU instance and
// compute instance, besides its parent's /dev/nvidiaN.
type MIGDevice struct {
	UUID string
	// CapabilityNodes are /dev/nvidia-caps/nvidia-cap<M>: the GPU
	// instance's access capability, then the compute instance's.
	CapabilityNodes []string
}

// DeviceNode is a character device to create in the container.
type DeviceNode struct {
	Path     string
	HostPath string
	Major    int64
	Minor    int64
}

// Mount is a bind mount: read-only (driver files, the MPS daemon's pipe
// directory) unless Writable (the MPS daemon's shm directory, where its
// clients write shared memory).
type Mount struct {
	HostPath      string
	ContainerPath string
	Writable      bool
}

// Edits is what a container gets.
type Edits struct {
	// Env is sorted "KEY=value".
	Env         []string
	DeviceNodes []DeviceNode
	Mounts      []Mount
}

// Options shape the edits.
type Options struct {
	// VisibleDevices names the GPUs in the visible-devices variables.
	VisibleDevices v1alpha1.VisibleDevices
	// DeviceNumbers returns a device node's major and minor.
	DeviceNumbers func(path string) (major, minor int64, err error)
	// DeviceHostRoot is where the device nodes are on the host ("" or
	// "/": the host's /dev; a driver container's root where it makes
	// them).
	DeviceHostRoot string
	// Driver, when set, gives the driver's files, carried into the
	// container as bind mounts.
	Driver DriverSource
	// MPS, when set, makes the container a client of its group's MPS
	// daemon.
	MPS *MPS
	// CombinedOf, when not 0, is for seats that share a container with
	// others (two claims, or two requests of one claim, in one
	// container): at least as many GPUs as any such container sees, at
	// most the node's. Each claim's CDI device sets the variables, and the
	// runtime keeps the last value it applies: a claim's own UUIDs would
	// hide the other claims' GPUs from CUDA. CUDA_VISIBLE_DEVICES then
	// lists indices 0..CombinedOf-1 in PCI order: CUDA stops at the first
	// index past the GPUs whose device nodes the container has, so it
	// sees exactly those, whichever spec came last.
	CombinedOf int
}

// The environment an MPS client gets.
const (
	EnvMPSPipeDirectory       = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSActiveThreadPercent = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPinnedMemLimit      = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// MPS is what makes a container a client of its group's MPS daemon: the
// daemon's pipe directory, at the path CUDA_MPS_PIPE_DIRECTORY names, and
// its shm directory as /dev/shm (MPS clients and server exchange shared
// memory there), and the claim's share as its client limits. The limits in
// the environment are the claim's own; the daemon holds them too (see
// package mps), so raising them in the container gains nothing.
//
// The pipe directory is mounted read-only unless PipeWritable: clients
// only connect to the daemon's sockets there, which a read-only mount
// allows, and a writable one would let a container's root remove or
// replace them.
type MPS struct {
	HostPipeDir      string
	ContainerPipeDir string
	PipeWritable     bool
	HostShmDir       string
	// ActiveThreadPercentage and PinnedMemLimit are the values of
	// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
	ActiveThreadPercentage int
	PinnedMemLimit         string
	// PinnedMemMiB is that limit per GPU of the group, in MiB, as the DRA
	// plugin's device metadata gives it.
	PinnedMemMiB []int64
}

// Build computes the edits for a container holding seats.
func Build(seats []Seat, opts Options) (*Edits, error) {
	if len(seats) == 0 {
		return nil, fmt.Errorf("no seats")
	}
	var gpus []inventory.GPU
	var groups, seatIDs, gens, migUUIDs, capNodes, memory, compute []string
	sized := true
	admin := seats[0].AdminAccess
	for _, s := range seats {
		if len(s.Seats) != len(s.Generations) {
			return nil, fmt.Errorf("group %s: %d seats but %d generations", s.Group, len(s.Seats), len(s.Generations))
		}
		if s.AdminAccess != admin {
			return nil, fmt.Errorf("group %s: seats with and without admin access in one request", s.Group)
		}
		if s.AdminAccess {
			// One entry per group: there is no seat to list.
			groups = append(groups, s.Group)
		}
		for i := range s.Seats {
			groups = append(groups, s.Group)
			seatIDs = append(seatIDs, strconv.Itoa(s.Seats[i]))
			gens = append(gens, strconv.FormatInt(s.Generations[i], 10))
			if s.Size != nil {
				memory = append(memory, strconv.FormatInt(s.Size.MemoryBytes, 10))
				compute = append(compute, strconv.FormatInt(s.Size.ComputePercent, 10))
			}
		}
		sized = sized && s.Size != nil
		for _, g := range s.GPUs {
			if !slices.ContainsFunc(gpus, func(x inventory.GPU) bool { return x.UUID == g.UUID }) {
				gpus = append(gpus, g)
			}
		}
		if s.MIG != nil {
			migUUIDs = append(migUUIDs, s.MIG.UUID)
			capNodes = append(capNodes, s.MIG.CapabilityNodes...)
		}
	}
	slices.SortFunc(gpus, func(a, b inventory.GPU) int { return a.Index - b.Index })

	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		uuids[i] = g.UUID
	}
	env := map[string]string{
		// The NVIDIA runtime reads this on the host, where only UUIDs are
		// unambiguous.
		EnvNVIDIAVisibleDevices: strings.Join(uuids, ","),
		EnvGroup:                strings.Join(groups, ","),
		EnvSeat:                 strings.Join(seatIDs, ","),
		EnvGeneration:           strings.Join(gens, ","),
	}
	if sized && len(memory) > 0 {
		env[EnvSeatMemory] = strings.Join(memory, ",")
		env[EnvSeatCompute] = strings.Join(compute, ",")
	}
	if admin {
		delete(env, EnvSeat)
		delete(env, EnvGeneration)
		env[EnvAdminAccess] = "true"
	}
	if m := opts.MPS; m != nil {
		env[EnvMPSPipeDirectory] = m.ContainerPipeDir
		env[EnvMPSActiveThreadPercent] = strconv.Itoa(m.ActiveThreadPercentage)
		env[EnvMPSPinnedMemLimit] = m.PinnedMemLimit
	}
	switch {
	case len(migUUIDs) > 0:
		// A MIG instance has no index of its own among the GPUs a
		// container's device nodes show: it is named by its UUID
		// whatever the claim's configuration says.
		env[EnvNVIDIAVisibleDevices] = strings.Join(migUUIDs, ",")
		env[EnvCUDAVisibleDevices] = strings.Join(migUUIDs, ",")
	case opts.CombinedOf > 0:
		env[EnvCUDAVisibleDevices] = indices(opts.CombinedOf)
		env[EnvCUDADeviceOrder] = "PCI_BUS_ID"
	case opts.VisibleDevices == v1alpha1.VisibleDevicesIndex:
		// Inside the container CUDA numbers the devices it can open from
		// 0, in PCI order when told so.
		env[EnvCUDAVisibleDevices] = indices(len(gpus))
		env[EnvCUDADeviceOrder] = "PCI_BUS_ID"
	default:
		env[EnvCUDAVisibleDevices] = strings.Join(uuids, ",")
	}
	e := &Edits{}
	for k, v := range env {
		e.Env = append(e.Env, k+"="+v)
	}
	slices.Sort(e.Env)

	var paths []string
	for _, g := range gpus {
		paths = append(paths, "/dev/nvidia"+strconv.Itoa(g.Minor))
	}
	paths = append(paths, ControlDevices...)
	paths = append(paths, capNodes...)
	for _, p := range paths {
		major, minor, err := opts.DeviceNumbers(p)
		if err != nil {
			return nil, fmt.Errorf("device node %s: %w", p, err)
		}
		e.DeviceNodes = append(e.DeviceNodes, DeviceNode{Path: p, HostPath: filepath.Join("/", opts.DeviceHostRoot, p), Major: major, Minor: minor})
	}
	if opts.Driver != nil {
		files, err := opts.Driver.Files()
		if err != nil {
			return nil, fmt.Errorf("driver files: %w", err)
		}
		if !files.Empty() {
			e.Mounts = files.Mounts()
		}
	}
	if m := opts.MPS; m != nil {
		e.Mounts = append(e.Mounts,
			Mount{HostPath: m.HostPipeDir, ContainerPath: m.ContainerPipeDir, Writable: m.PipeWritable},
			Mount{HostPath: m.HostShmDir, ContainerPath: "/dev/shm", Writable: true})
	}
	return e, nil
}

// indices lists 0..n-1, as CUDA_VISIBLE_DEVICES names devices by index.
func indices(n int) string {
	idx := make([]string, n)
	for i := range idx {
		idx[i] = strconv.Itoa(i)
	}
	return strings.Join(idx, ",")
}
