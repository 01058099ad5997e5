// Package doctor says whether a node is ready for the plugin, and when it
// is not, what is wrong and what to do: NVML and the GPUs, the plan, the
// driver files a container would get, the CDI and kubelet directories, the
// container runtime's CDI setting, the checkpoint, and whether pods of the
// device-plugin shim still hold GPUs (the kubelet's PodResources API), and
// what the groups of sized profiles publish, hold and have their MPS
// daemons enforce. `kyb-dra-plugin doctor`
// prints its report; the chart runs it as an init container, so that a
// broken node says why in `kubectl logs`.
//
// The doctor never changes the node's state: it writes nothing but an
// empty file it removes at once (to learn whether a directory is
// writable) and, with --probe, a seat's spec outside the CDI root; it
// takes no lock the plugin takes and talks to no API server, so that it is
// safe beside a running plugin.
//
// Each step of the examination runs under a deadline (--check-timeout):
// what it reads is the node's, and a read that never returns (a FIFO or a
// device where a file was expected, a hung network file system, a wedged
// driver) fails that step's checks and the doctor goes on, rather than
// hold the node's init container for ever without a word.
package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
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
	// PodResourcesSocket is the kubelet's PodResources API; where set, the
	// handover check asks it whether pods of the device-plugin shim still
	// hold GPUs.
	PodResourcesSocket string
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
	// BootID is the node's boot (package bootid), as the plugin reads it
	// (--boot-id-file): the MIG journal's records of another boot are an
	// earlier boot's, which name nothing on the GPUs now. Empty: not
	// known, and every record is taken for this boot's.
	BootID string
	// CheckTimeout bounds each step of the examination (the probe's step:
	// beyond the probe's own timeout); 0: DefaultCheckTimeout.
	CheckTimeout time.Duration
	// MPSRoot is the plugin's --mps-root, where its MPS daemons' records
	// are; empty: its default, <plugin directory>/mps.
	MPSRoot string
	// Host, when set, is the node's GPUs already opened (a simulated
	// node whose MIG state a caller made), examined instead of opening
	// them from Node; the caller closes it.
	Host *gpuhost.Host
}

// DefaultCheckTimeout is how long a step may take: NVML's start on a node
// of many GPUs without persistence mode takes tens of seconds, a directory
// or file read far less.
const DefaultCheckTimeout = 2 * time.Minute

// examination is what the checks learn on the way: later checks build on
// what earlier ones opened.
type examination struct {
	opts   Options
	report *Report
	host   *gpuhost.Host
	inv    *inventory.Inventory
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
		if e.host != nil && opts.Host == nil {
			_ = e.host.Close() // nothing is left to do about a failed shutdown
		}
	}()
	timeout := opts.CheckTimeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	steps := []struct {
		checks []string
		run    func(*examination, context.Context)
	}{
		{[]string{"config", "nvml", "gpus", "topology", "plan"}, (*examination).checkNode},
		{[]string{"mig"}, (*examination).checkMIG},
		{[]string{"mig-config"}, (*examination).checkMIGConfig},
		{[]string{"driver-files"}, (*examination).checkDriverFiles},
		{[]string{"nvidia-cdi"}, func(e *examination, _ context.Context) { e.checkNVIDIACDI() }},
		{[]string{"cdi-root"}, func(e *examination, _ context.Context) { e.checkCDIRoot() }},
		{[]string{"kubelet"}, func(e *examination, _ context.Context) { e.checkKubeletDirs() }},
		{[]string{"runtime-cdi"}, func(e *examination, _ context.Context) { e.checkRuntime() }},
		{[]string{"checkpoint"}, func(e *examination, _ context.Context) { e.checkCheckpoint() }},
	}
	for _, s := range steps {
		e.step(ctx, timeout, s.checks, s.run)
	}
	if e.hasSizes() {
		e.step(ctx, timeout, []string{"sized-seats"}, (*examination).checkSizedSeats)
	}
	if opts.PodResourcesSocket != "" {
		e.step(ctx, timeout, []string{"handover"}, (*examination).checkHandover)
	}
	if opts.Probe != nil {
		e.step(ctx, opts.Probe.timeout()+timeout, []string{"probe"}, (*examination).checkProbe)
	}
	return e.report
}

// step runs one step of the examination, which adds checks, under a
// deadline. The step works on a copy of what the examination learnt so
// far, taken back when it finishes in time. One that does not is left
// behind, blocked where it is, and never touches the examination again;
// the checks it would have added fail, saying so.
func (e *examination) step(ctx context.Context, timeout time.Duration, checks []string, run func(*examination, context.Context)) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sub := *e
	sub.report = &Report{Counts: map[Status]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(&sub, ctx)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		select {
		case <-done:
		default:
			why := fmt.Sprintf("not finished within %s (--check-timeout): a read or call of the check never returned", timeout)
			if ctx.Err() != context.DeadlineExceeded {
				why = "interrupted: " + context.Cause(ctx).Error()
			}
			for _, name := range checks {
				e.add(Check{Name: name, Status: Fail, Summary: why,
					Fix: "something the check reads blocks: a FIFO or a device where a file belongs (in the CDI, kubelet or runtime configuration directories), a hung network file system, or a wedged driver (dmesg); fix that, or raise --check-timeout on a slow node"})
			}
			return
		}
	}
	report := e.report
	*e = sub
	e.report = report
	for _, c := range sub.report.Checks {
		e.add(c)
	}
}
