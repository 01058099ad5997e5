// Package nvmlconformance is one suite of the NVML facts the plugin relies
// on, run against any NVML: the simulated node's in the unit tests (every
// preset), a real GPU's in `make gpu-check`. containerd runs one
// content-store suite against every store for the same reason: the
// simulated node is only worth its tests while it answers as a real
// driver does, and a suite that both must pass is what notices when one
// drifts from the other.
//
// Each check asks what the plugin's packages ask, the way they ask it,
// and asserts what they take for granted about the answer:
//
//   - discovery, identity, distinct-gpus: pkg/inventory's discovery and
//     the health monitor's probes (index, UUID, name, memory, PCI address,
//     minor number, all consistent; UUIDs GPU-prefixed and unique);
//   - device-numbers: the majors of /proc/devices (nvidia, nvidia-uvm,
//     nvidia-caps, which the kernel allocates at module load), the
//     numbers pkg/gpuhost gives /dev/nvidia<minor>, nvidiactl, the UVM
//     nodes and the MIG capability nodes, and those of the nodes in /dev
//     where this process sees them;
//   - links: NVLink and PCIe queries answer, or fail as discovery expects;
//   - mig-geometry, mig-instances, mig-devices: pkg/mig's reading of the
//     geometry (profiles until ERROR_INVALID_ARGUMENT, placements asked
//     with the profile's info) and what the planner builds on it (an
//     instance count that fits at once, memory that matches the
//     placements, names as the plugin derives them), pkg/miginstance's
//     listing of GPU instances, pkg/gpuusage's MIG devices;
//   - processes: pkg/gpuusage's memory, utilization and process lists;
//   - events: pkg/health's event set, registered for the supported types
//     (no event is waited for);
//   - modes: the compute and persistence modes the MPS path and
//     gpu-check read.
//
// The suite changes nothing: no mode, no instance, no event is made to
// happen. A check that does not apply (a GPU without MIG, MIG mode off)
// is skipped with the reason.
package nvmlconformance

import (
	"context"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// Kernel is what the suite reads of the node beside NVML. pkg/gpuhost's
// Host is one (the host's /proc and /dev, or the simulated node's).
type Kernel interface {
	// ReadProcFile reads a kernel file: /proc/devices, mig-minors.
	ReadProcFile(name string) ([]byte, error)
	// ReadCapability reads a capability file under
	// /proc/driver/nvidia/capabilities, such as mig/config.
	ReadCapability(name string) (gpuhost.Capability, error)
	// DeviceNumbers are the numbers the plugin gives a device node.
	DeviceNumbers(devPath string) (major, minor int64, err error)
	// StatDevice is the device node as the node's /dev has it; an error
	// that is fs.ErrNotExist where this process sees no such node.
	StatDevice(devPath string) (gpuhost.DeviceNode, error)
}

// Target is the node the suite examines.
type Target struct {
	// NVML is initialised by the caller, who owns the session.
	NVML   nvml.Interface
	PCIe   inventory.PCIeTopology
	Kernel Kernel
}

// Status is a check's outcome.
type Status string

const (
	Pass Status = "pass"
	Fail Status = "fail"
	// Skip: the check does not apply here; the message says why.
	Skip Status = "skip"
)

// The checks, by name.
const (
	CheckDiscovery     = "discovery"
	CheckIdentity      = "identity"
	CheckDistinctGPUs  = "distinct-gpus"
	CheckDeviceNumbers = "device-numbers"
	CheckLinks         = "links"
	CheckMIGGeometry   = "mig-geometry"
	CheckMIGInstances  = "mig-instances"
	CheckMIGDevices    = "mig-devices"
	CheckProcesses     = "processes"
	CheckEvents        = "events"
	CheckModes         = "modes"
)

// NodeWide is Result.GPU for a check of the whole node.
const NodeWide = -1

// Result is one check of one GPU, or of the node (GPU NodeWide).
type Result struct {
	Check  string
	GPU    int
	Status Status
	// Message says what was found; for a failure, every disagreement.
	Message string
}

func (r Result) String() string {
	on := "node"
	if r.GPU != NodeWide {
		on = fmt.Sprintf("GPU %d", r.GPU)
	}
	return fmt.Sprintf("%-4s  %-14s  %-6s  %s", r.Status, r.Check, on, r.Message)
}

// Report is the suite's results, in the order the checks ran.
type Report []Result

// Failed are the failed results.
func (r Report) Failed() []Result {
	var out []Result
	for _, x := range r {
		if x.Status == Fail {
			out = append(out, x)
		}
	}
	return out
}

// Count is how many results have status s.
func (r Report) Count(s Status) int {
	n := 0
	for _, x := range r {
		if x.Status == s {
			n++
		}
	}
	return n
}

// Summary is one line: how many checks passed, were skipped, failed.
func (r Report) Summary() string {
	return fmt.Sprintf("%d passed, %d skipped, %d failed", r.Count(Pass), r.Count(Skip), r.Count(Fail))
}

// Find returns the result of a check on a GPU (NodeWide for the node).
func (r Report) Find(check string, gpu int) (Result, bool) {
	for _, x := range r {
		if x.Check == check && x.GPU == gpu {
			return x, true
		}
	}
	return Result{}, false
}

// gpu is what the suite learnt of one GPU, for the checks after
// identity.
type gpu struct {
	index int
	dev   nvml.Device
	uuid  string
	busID string
	minor int
	name  string
	// memoryBytes is GetMemoryInfo's total, which profile names and the
	// memory of MIG profiles are measured against.
	memoryBytes uint64
	// migCapable: GetMigMode answers; migOn: MIG mode is on.
	migCapable, migOn bool
	// geometry is the geometry as pkg/mig reads it, nil without one.
	geometry *geometry
}

// suite is one run.
type suite struct {
	t       Target
	gpus    []*gpu
	results Report
}

// Run runs every check once and reports each.
func Run(ctx context.Context, t Target) Report {
	s := &suite{t: t}
	n, ok := s.discovery(ctx)
	if !ok {
		return s.results
	}
	for i := range n {
		g, res := s.identity(i)
		s.add(res)
		if g == nil {
			for _, c := range []string{CheckModes, CheckProcesses, CheckMIGGeometry, CheckMIGInstances, CheckMIGDevices} {
				s.add(Result{Check: c, GPU: i, Status: Skip, Message: "no NVML handle (identity)"})
			}
			continue
		}
		s.gpus = append(s.gpus, g)
		// The geometry first: whether MIG mode is on decides where the
		// processes are read.
		geo := s.migGeometry(g)
		s.add(s.modes(g))
		s.add(s.processes(g))
		s.add(geo)
		if g.geometry == nil {
			// Nothing to check instances and MIG devices against.
			why := geo.Message
			if geo.Status == Fail {
				why = "the MIG geometry fails its check"
			}
			s.add(Result{Check: CheckMIGInstances, GPU: i, Status: Skip, Message: why})
			s.add(Result{Check: CheckMIGDevices, GPU: i, Status: Skip, Message: why})
			continue
		}
		s.add(s.migInstances(g))
		s.add(s.migDevices(g))
	}
	s.add(s.distinct(n))
	s.add(s.deviceNumbers())
	s.add(s.links())
	s.add(s.events())
	return s.results
}

func (s *suite) add(r Result) { s.results = append(s.results, r) }

// problems collects what disagrees in one check.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// result is the check's result: a failure naming every problem, else a
// pass saying what was found.
func (p problems) result(check string, gpu int, found string) Result {
	if len(p) > 0 {
		return Result{Check: check, GPU: gpu, Status: Fail, Message: strings.Join(p, "; ")}
	}
	return Result{Check: check, GPU: gpu, Status: Pass, Message: found}
}

// errorString names an NVML answer as nvidia-smi does ("Not Supported").
func (s *suite) errorString(ret nvml.Return) string { return s.t.NVML.ErrorString(ret) }

// gpuLine is what a node-wide check found on one GPU.
type gpuLine struct {
	gpu  int
	text string
}

// grouped writes lines with GPUs that found the same together, in the
// order each was first found: "GPU 0, 1: no NVLink; GPU 2: …".
func grouped(lines []gpuLine) string {
	var order []string
	gpus := map[string][]string{}
	for _, l := range lines {
		if _, ok := gpus[l.text]; !ok {
			order = append(order, l.text)
		}
		gpus[l.text] = append(gpus[l.text], fmt.Sprint(l.gpu))
	}
	out := make([]string, 0, len(order))
	for _, text := range order {
		out = append(out, fmt.Sprintf("GPU %s: %s", strings.Join(gpus[text], ", "), text))
	}
	return strings.Join(out, "; ")
}
