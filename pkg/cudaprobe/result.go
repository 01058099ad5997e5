// Package cudaprobe is what the CUDA probe reports: what the CUDA driver
// showed a process (its devices, their UUIDs and memory, whether it could
// allocate on each) and the process's GPU environment. kyb-cuda-probe
// prints it as JSON (package driverapi asks the driver); the doctor reads
// it back. This package links no C code, so that the doctor does not.
package cudaprobe

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Result is what the probe saw. It is the JSON contract between the probe
// and the doctor.
type Result struct {
	// Library is the file libcuda.so.1 was loaded from.
	Library string `json:"library,omitempty"`
	// DriverVersion is cuDriverGetVersion's answer, such as 13000.
	DriverVersion int `json:"driverVersion,omitempty"`
	// Error says why the probe stopped before listing devices.
	Error   string   `json:"error,omitempty"`
	Devices []Device `json:"devices"`
	// Env holds the process's GPU-related environment variables.
	Env map[string]string `json:"env"`
	// DeviceNodes are the /dev/nvidia* entries the process sees.
	DeviceNodes []string `json:"deviceNodes"`
}

// Device is one CUDA device as the process enumerates it.
type Device struct {
	Ordinal     int    `json:"ordinal"`
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	MemoryBytes uint64 `json:"memoryBytes"`
	// MemAlloc is "ok", or why allocating on the device failed.
	MemAlloc string `json:"memAlloc"`
	// FreeBytes is the memory the device's context may still allocate
	// (cuMemGetInfo), read before the Tries; under MPS it is bounded by
	// the client's pinned-memory limit. 0 where none was tried.
	FreeBytes uint64 `json:"freeBytes,omitempty"`
	// Tries are the allocations the probe was asked to try, in order,
	// each freed again before the next.
	Tries []Try `json:"tries,omitempty"`
}

// Try is one allocation tried on a device.
type Try struct {
	Bytes uint64 `json:"bytes"`
	// Result is "ok", or why cuMemAlloc refused ("cuMemAlloc: CUDA error
	// 2 (out of memory)").
	Result string `json:"result"`
}

// Lines are what the probe saw, a line each, for a report: the GPU
// environment, the device nodes, the library, and each device with the
// allocations tried on it.
func (r *Result) Lines() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(r.Env)) {
		out = append(out, "env "+k+"="+r.Env[k])
	}
	out = append(out, "device nodes: "+strings.Join(r.DeviceNodes, " "))
	if r.Library != "" {
		out = append(out, fmt.Sprintf("libcuda: %s (CUDA driver API %d)", r.Library, r.DriverVersion))
	}
	for _, d := range r.Devices {
		out = append(out, fmt.Sprintf("CUDA device %d: %s %s, %d MiB, cuMemAlloc %s", d.Ordinal, d.Name, d.UUID, d.MemoryBytes>>20, d.MemAlloc))
		for _, t := range d.Tries {
			out = append(out, fmt.Sprintf("CUDA device %d: cuMemAlloc of %d MiB: %s", d.Ordinal, t.Bytes>>20, t.Result))
		}
	}
	return out
}
