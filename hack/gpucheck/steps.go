//go:build gpucheck

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// check is one run: the node as the plugin plans it (opened here too, for
// the GPUs' settings and the usage sample), the plugin's directories, and
// what each step leaves for the next.
type check struct {
	o      options
	node   *nodesetup.Node
	work   string
	dirs   pluginDirs
	report *report
	before []gpuSettings
	claim  *claimRun
	mps    *mpsRun
}

// pluginDirs are the plugin's directories, all in a temporary directory:
// the node's own (a kubelet's, a CDI root) are left alone.
type pluginDirs struct {
	cdi, plugins, registry, devicePlugins string
}

func (d pluginDirs) args() []string {
	return []string{"--cdi-root", d.cdi, "--kubelet-plugins-directory-path", d.plugins,
		"--kubelet-registrar-directory-path", d.registry, "--device-plugin-directory-path", d.devicePlugins}
}

func newCheck(ctx context.Context, o options) (*check, error) {
	node, err := o.node.Open(ctx)
	if err != nil {
		return nil, err
	}
	if err := changesNoSetting(node.Plan); err != nil {
		node.Close(ctx)
		return nil, err
	}
	// Short: the plugin's sockets are made below it, and a socket's path
	// has 108 bytes at most.
	work, err := os.MkdirTemp("", "kyb-gpu-check-")
	if err != nil {
		node.Close(ctx)
		return nil, err
	}
	c := &check{o: o, node: node, work: work}
	if c.dirs, err = newPluginDirs(work); err != nil {
		c.close(ctx)
		return nil, err
	}
	c.report = newReport(o, node)
	c.before = readSettings(node.Host.NVML, node.Inv)
	return c, nil
}

// newPluginDirs makes the plugin's directories under base.
func newPluginDirs(base string) (pluginDirs, error) {
	d := pluginDirs{
		cdi: filepath.Join(base, "cdi"), plugins: filepath.Join(base, "plugins"),
		registry: filepath.Join(base, "registry"), devicePlugins: filepath.Join(base, "device-plugins"),
	}
	for _, dir := range []string{d.cdi, d.plugins, d.registry, d.devicePlugins} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return d, err
		}
	}
	return d, nil
}

func (c *check) close(ctx context.Context) {
	if c.claim != nil {
		c.claim.stop()
	}
	if c.mps != nil && c.mps.claimRun != nil {
		c.mps.stop()
	}
	c.node.Close(ctx)
	_ = os.RemoveAll(c.work)
}

// changesNoSetting refuses a plan under which the plugin would change a
// GPU's settings: an MPS profile that does not keep the compute mode puts
// its GPUs in EXCLUSIVE_PROCESS, a time slice runs nvidia-smi
// compute-policy, and a group on a GPU a MIG profile shares is readied by
// turning the GPU's MIG mode off (miginstance.Manager.WholeGPU, at once
// on Hopper and later). The last is refused whatever the GPU's MIG mode
// is now, as the others are whatever claim a step prepares: the promise
// is of the plan, not of the GPUs' state when a step runs. The plugin
// resets no GPU.
func changesNoSetting(plan *planner.Plan) error {
	for _, p := range plan.Profiles {
		if p.Sharing == v1alpha1.SharingMPS && p.MPSComputeMode != v1alpha1.MPSComputeModeKeep {
			return fmt.Errorf("profile %s shares its GPUs with MPS in compute mode EXCLUSIVE_PROCESS, which changes their compute mode: gpu-check prepares no such profile (mps: {computeMode: keep} leaves it)", p.Resource)
		}
		if p.TimeSlice != "" {
			return fmt.Errorf("profile %s sets a time slice (%s): gpu-check changes no GPU's time slice", p.Resource, p.TimeSlice)
		}
	}
	migProfiles := map[int]string{}
	for _, p := range plan.Profiles {
		if p.MIG == nil {
			continue
		}
		for _, g := range p.MIG.GPUs {
			if _, ok := migProfiles[g.Index()]; !ok {
				migProfiles[g.Index()] = p.Resource
			}
		}
	}
	// A MIG profile has no groups: these are the whole-GPU, MPS and
	// time-sliced ones.
	for _, g := range plan.Groups() {
		for _, x := range g.GPUs {
			if shared, ok := migProfiles[x]; ok {
				return fmt.Errorf("profile %s's group %s has GPU %d, which MIG profile %s shares: the plugin readies the group by turning the GPU's MIG mode off where it is on, and gpu-check changes no GPU's MIG mode", g.Profile.Resource, g.DeviceName(), x, shared)
			}
		}
	}
	return nil
}

// outcome is what a step found: a line for the table, the command it ran
// (if one), its output and further lines for the report. The output is
// quoted in the report unless logOnly, and kept whole in the step's log.
// hardware says what of the step met the GPU and its driver (on a
// simulated node, their stand-ins), unchecked what the step could not
// check there.
type outcome struct {
	summary   string
	command   string
	output    string
	logOnly   bool
	details   []string
	hardware  string
	unchecked []string
}

// step runs one step and records its outcome; it returns whether it
// succeeded.
func (c *check) step(ctx context.Context, id, title string, f func(context.Context) (outcome, error)) bool {
	start := time.Now()
	out, err := f(ctx)
	c.report.add(c.o.out, stepResult{id: id, title: title, took: time.Since(start), outcome: out, err: err})
	return err == nil
}

// skip records a step not run, and why.
func (c *check) skip(id, title, why string) {
	c.report.add(c.o.out, stepResult{id: id, title: title, skipped: why})
}

func (c *check) runSteps(ctx context.Context) {
	c.step(ctx, "1", "NVML discovery and `kyb-dra-plugin plan`", c.plan)
	c.step(ctx, "2", "`kyb-dra-plugin doctor`", func(ctx context.Context) (outcome, error) { return c.doctor(ctx, false) })
	c.step(ctx, "3", "`kyb-dra-plugin doctor --probe`: a seat's container and the real libcuda", func(ctx context.Context) (outcome, error) { return c.doctor(ctx, true) })
	const usageTitle = "a CUDA context in the claim's container, as the per-pod usage sampler reads NVML"
	if c.step(ctx, "4", "a claim prepared over the plugin's sockets, its container probed", c.prepare) {
		c.step(ctx, "5", usageTitle, c.usage)
	} else {
		c.skip("5", usageTitle, "step 4 prepared no claim")
	}
	if c.claim != nil && c.claim.kubelet != nil {
		c.step(ctx, "6", "the claim unprepared", c.unprepare)
	} else {
		c.skip("6", "the claim unprepared", "the plugin did not register")
	}
	if c.claim != nil {
		c.claim.stop()
	}
	c.step(ctx, "7", "an MPS seat, the GPU's compute mode kept: its daemon started, its container probed, allocations above and below its share", c.prepareMPS)
	const mpsStopTitle = "the MPS seat unprepared, its daemon stopped"
	if c.mps != nil && c.mps.claimRun != nil && c.mps.kubelet != nil {
		c.step(ctx, "8", mpsStopTitle, c.unprepareMPS)
	} else {
		c.skip("8", mpsStopTitle, "the plugin of step 7 did not register")
	}
	if c.mps != nil && c.mps.claimRun != nil {
		c.mps.stop()
	}
	c.step(ctx, "9", "the health monitor registered for the GPUs' events", c.health)
	c.step(ctx, "10", "NVML conformance: the facts the plugin relies on, as the simulated node's tests assert them", c.conformance)
	c.migGeometry(ctx, "11")
	c.migPlan(ctx, "12")
	c.step(ctx, "13", "the GPUs' settings, before and after", c.settings)
}

// nodeArgs are the plugin's flags for this node.
func (c *check) nodeArgs() []string {
	args := []string{"--node-name", c.o.node.NodeName}
	if c.o.node.DriverRoot != "/" {
		args = append(args, "--driver-root", c.o.node.DriverRoot)
	}
	if c.o.node.Simulate != "" {
		args = append(args, "--simulate", c.o.node.Simulate)
	}
	return args
}

// runPlugin runs the plugin's binary with args and none of this
// process's environment but PATH: what it examines is what the flags say.
func (c *check) runPlugin(ctx context.Context, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	bin := filepath.Join(c.o.bin, "kyb-dra-plugin")
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	line := commandLine("kyb-dra-plugin", args)
	if err != nil {
		return line, string(out), fmt.Errorf("%s: %w", line, err)
	}
	return line, string(out), nil
}

// plan is step 1: the GPUs NVML shows, and the plan the plugin makes of
// them.
func (c *check) plan(ctx context.Context) (outcome, error) {
	line, out, err := c.runPlugin(ctx, append([]string{"plan"}, c.nodeArgs()...)...)
	o := outcome{command: line, output: out, hardware: "the driver's NVML: the GPUs, their links and PCIe places, read by the plugin's binary"}
	groups := 0
	for _, p := range c.node.Plan.Profiles {
		groups += len(p.Groups)
	}
	o.summary = fmt.Sprintf("%s; %d groups in %d profiles", c.node.Inv.Summary(), groups, len(c.node.Plan.Profiles))
	for _, w := range c.node.Inv.Warnings {
		o.details = append(o.details, "discovery warning: "+w)
	}
	return o, err
}

// doctor is steps 2 and 3: the doctor over the plugin's directories, with
// the CUDA probe or without.
func (c *check) doctor(ctx context.Context, probe bool) (outcome, error) {
	args := append(append([]string{"doctor"}, c.nodeArgs()...), c.dirs.args()...)
	if probe {
		args = append(args, "--probe", "--probe-binary", filepath.Join(c.o.bin, "kyb-cuda-probe"))
	}
	line, out, err := c.runPlugin(ctx, args...)
	o := outcome{command: line, output: out, summary: lastLine(out), hardware: "the driver's NVML, device nodes and files, read by the plugin's binary"}
	if probe {
		o.hardware = "the driver's libcuda.so.1, in a seat's container built from the doctor's CDI spec"
		o.details, o.logOnly = checkLines(out, "probe"), true
		if f := strings.Fields(o.details[0]); len(f) > 2 && f[0] == "probe" {
			o.summary = "the probe check: " + strings.Join(f[2:], " ")
		}
		if os.Geteuid() != 0 {
			o.details = append(o.details, "not run as root: the probe's sandbox needs mount and PID namespaces")
		}
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		err = fmt.Errorf("a check failed (exit %d)", exit.ExitCode())
	}
	return o, err
}

// lastLine is the last line of out that is not blank.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// checkLines are the lines of the doctor's check name in its table: its
// own and the indented ones below it.
func checkLines(out, name string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 1 && f[0] == name:
			lines = append(lines, l)
		case len(lines) > 0 && strings.HasPrefix(l, " ") && len(f) > 0:
			lines = append(lines, l)
		case len(lines) > 0:
			return lines
		}
	}
	if len(lines) == 0 {
		return []string{"the doctor printed no " + name + " check"}
	}
	return lines
}

// commandLine is a command as a shell would take it.
func commandLine(name string, args []string) string {
	out := []string{name}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// settings is the last step: every GPU's compute, MIG and persistence
// modes as they were before the first step.
func (c *check) settings(context.Context) (outcome, error) {
	const hw = "NVML's GetComputeMode, GetMigMode and GetPersistenceMode of every GPU, before step 1 and now"
	after := readSettings(c.node.Host.NVML, c.node.Inv)
	c.report.settings(c.before, after)
	changed := changedSettings(c.before, after)
	if len(changed) > 0 {
		return outcome{summary: strings.Join(changed, "; "), details: changed, hardware: hw}, fmt.Errorf("%d GPU settings changed", len(changed))
	}
	return outcome{summary: fmt.Sprintf("compute, MIG and persistence modes of %d GPUs as they were", len(after)), hardware: hw}, nil
}
