// Package doctor says whether a node is ready for the plugin, and when it
// is not, what is wrong and what to do: NVML and the GPUs, the plan, the
// driver files a container would get, the CDI and kubelet directories, the
// container runtime's CDI setting, the checkpoint. `kyb-dra-plugin doctor`
// prints its report; the chart runs it as an init container, so that a
// broken node says why in `kubectl logs`.
//
// The doctor never changes the node's state: it writes nothing but an
// empty file it removes at once (to learn whether a directory is
// writable) and, with --probe, a seat's spec outside the CDI root; it
// takes no lock the plugin takes and talks to no API server, so that it is
// safe beside a running plugin.
package doctor

import (
	"context"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

// Status is a check's verdict.
type Status string

const (
	// OK: nothing to do.
	OK Status = "ok"
	// Warn: the plugin runs, but something may not work as expected.
	Warn Status = "warn"
	// Fail: the plugin cannot serve the node until this is fixed.
	Fail Status = "fail"
)

// Check is the result of one check.
type Check struct {
	// Name is the check's stable name, such as "nvml".
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Summary is one line: what was found.
	Summary string `json:"summary"`
	// Details are further lines: what was found, item by item.
	Details []string `json:"details,omitempty"`
	// Fix says what to do, for warn and fail.
	Fix string `json:"fix,omitempty"`
}

// Report is what the doctor found on a node.
type Report struct {
	Node   string  `json:"node"`
	Checks []Check `json:"checks"`
	// Counts are the checks per status.
	Counts map[Status]int `json:"counts"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool { return r.Counts[Fail] > 0 }

// Options say which node to examine and where its directories are, as the
// plugin's flags say them.
type Options struct {
	Node nodesetup.Flags
	// DriverFiles is the plugin's --driver-files and --host-driver-root.
	DriverFiles nodesetup.DriverFilesFlags
	// CDIRoot, PluginsDir, RegistrarDir and DevicePluginDir are the
	// plugin's directories.
	CDIRoot         string
	PluginsDir      string
	RegistrarDir    string
	DevicePluginDir string
	// HostRoot is where the host's root file system is, as the doctor sees
	// it; the container runtime's configuration is read under it.
	HostRoot string
	// ContainerdConfig and CRIOConfig are the runtimes' configuration
	// files as the host sees them.
	ContainerdConfig string
	CRIOConfig       string
	// Probe, when set, runs the CUDA probe in a sandbox built from a
	// seat's CDI spec.
	Probe *ProbeOptions
}

// examination is what the checks learn on the way: later checks build on
// what earlier ones opened.
type examination struct {
	opts   Options
	report *Report
	host   *gpuhost.Host
	node   *nodesetup.Node
	files  *nodesetup.DriverFiles
	// state is the plugin's checkpoint, nil when it could not be read.
	state *checkpoint.State
}

func (e *examination) add(c Check) {
	e.report.Checks = append(e.report.Checks, c)
	e.report.Counts[c.Status]++
}

// Run examines the node. It never fails as a whole: what cannot be
// examined is a failed check.
func Run(ctx context.Context, opts Options) *Report {
	e := &examination{opts: opts, report: &Report{Node: opts.Node.NodeName, Counts: map[Status]int{OK: 0, Warn: 0, Fail: 0}}}
	defer func() {
		if e.host != nil {
			_ = e.host.Close() // nothing is left to do about a failed shutdown
		}
	}()
	e.checkNode(ctx)
	e.checkDriverFiles(ctx)
	e.checkNVIDIACDI()
	e.checkCDIRoot()
	e.checkKubeletDirs()
	e.checkRuntime()
	e.checkCheckpoint()
	if opts.Probe != nil {
		e.checkProbe(ctx)
	}
	return e.report
}
