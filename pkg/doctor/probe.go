package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdisandbox"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

// ProbeOptions say how to run the CUDA probe.
type ProbeOptions struct {
	// Program is kyb-cuda-probe.
	Program string
	// Claim, when set, probes that prepared claim's spec from the CDI
	// root; otherwise the doctor writes, outside the CDI root, the spec
	// the plugin would write for seat 0 of Group.
	Claim types.UID
	// Group names the group whose seat is probed; "": the plan's first.
	Group string
	// Timeout bounds the probe; 0: DefaultProbeTimeout. A wedged GPU
	// hangs cuInit for ever.
	Timeout time.Duration
}

func (o *ProbeOptions) timeout() time.Duration {
	if o.Timeout <= 0 {
		return DefaultProbeTimeout
	}
	return o.Timeout
}

// DefaultProbeTimeout is how long the probe may take: far more than
// cuInit takes on a healthy node with many GPUs (seconds), far less than
// an init container should hang.
const DefaultProbeTimeout = time.Minute

// probeClaimUID names the seat spec the doctor writes for itself; no API
// server hands out a UID of this shape.
const probeClaimUID = types.UID("kyb-doctor-probe")

// imageEnv is the environment of a plain image, which the sandbox's image
// stands for: no LD_LIBRARY_PATH, so the probe finds libcuda.so.1 only
// where our specs put it for any glibc image.
var imageEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}

// checkProbe runs the CUDA probe in a sandbox built only from a seat's CDI
// spec and says whether it saw exactly the seat's GPUs, and could use
// each; and whether the spec gives the container the device node of
// another GPU, which CUDA does not enumerate but the container can open.
func (e *examination) checkProbe(ctx context.Context) {
	c := Check{Name: "probe", Status: Fail}
	target, err := e.probeTarget()
	if target.cleanup != nil {
		defer target.cleanup()
	}
	if err != nil {
		c.Summary, c.Fix = err.Error(), "fix the checks above, or name a prepared claim with --probe-claim"
		e.add(c)
		return
	}
	want, what := target.want, target.what
	timeout := e.opts.Probe.timeout()
	// One deadline for every run of the probe.
	probeCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	opts := cdisandbox.Options{Specs: target.specs, Devices: target.devices, Program: e.opts.Probe.Program, BaseEnv: imageEnv, HostPath: e.seenPath}
	r, cfg, err := runProbe(probeCtx, opts)
	if err != nil {
		e.add(probeFailed(ctx, c, what, timeout, err))
		return
	}
	c.Details = probeDetails(cfg, r)
	saw, allocated := probeSaw(r)
	foreign, entries, nodesErr := gpuNodes{inv: e.inv, seen: e.seenPath}.foreign(target)
	c.Details = append(c.Details, entries...)
	switch {
	case r.Error != "":
		c.Summary = fmt.Sprintf("%s: the probe saw no GPU: %s", what, r.Error)
		c.Fix = "a container holding this seat would not run CUDA either: see the driver-files check (with no driver files, only the NVIDIA container runtime brings libcuda)"
	case !slices.Equal(saw, want):
		c.Summary = fmt.Sprintf("%s: the probe saw %v, %s", what, saw, target.expected)
		c.Fix = "the CDI spec gives a container other GPUs than the seat's: report this as a bug with the spec and this output"
	case nodesErr != nil:
		c.Summary, c.Fix = what+": "+nodesErr.Error(), "see the gpus check: the GPUs' minor numbers say which GPU a device node is"
	case len(foreign) > 0:
		c.Summary = fmt.Sprintf("%s: the spec gives the device node of %s, which CUDA did not enumerate; %s", what, strings.Join(foreign, ", "), target.expected)
		c.Fix = "a container can open every GPU device node its spec gives, whatever CUDA_VISIBLE_DEVICES says and whatever the node's path: find what wrote the spec; the plugin gives a container only its own GPUs' nodes"
	case !allocated:
		c.Summary = what + ": the probe saw the seat's GPUs but could not allocate on each"
		c.Fix = "see the devices' lines: the device nodes are there but CUDA cannot use them"
	default:
		c.Status = OK
	}
	if c.Status != OK || !slices.ContainsFunc(cfg.Env, func(kv string) bool { return strings.HasPrefix(kv, cudaVisibleDevices+"=") }) {
		if c.Status == OK {
			c.Summary = fmt.Sprintf("%s: a container sees exactly its %s and allocates on each", what, count(len(want), "GPU"))
		}
		e.add(c)
		return
	}
	// A process in the container may unset CUDA_VISIBLE_DEVICES: CUDA
	// then enumerates every GPU whose node the container has.
	opts.Unset = []string{cudaVisibleDevices}
	unset := what + " with " + cudaVisibleDevices + " unset"
	r, _, err = runProbe(probeCtx, opts)
	if err != nil {
		e.add(probeFailed(ctx, c, unset, timeout, err))
		return
	}
	for _, d := range r.Devices {
		c.Details = append(c.Details, fmt.Sprintf("%s unset: CUDA device %d: %s", cudaVisibleDevices, d.Ordinal, d.UUID))
	}
	switch saw, _ := probeSaw(r); {
	case r.Error != "":
		c.Status, c.Summary = Fail, fmt.Sprintf("%s: the probe saw no GPU: %s", unset, r.Error)
		c.Fix = "see the probe's lines: CUDA found the seat's GPUs only through CUDA_VISIBLE_DEVICES"
	case !slices.Equal(saw, want):
		c.Status, c.Summary = Fail, fmt.Sprintf("%s: the probe saw %v, %s", unset, saw, target.expected)
		c.Fix = "the container can open other GPUs than its own, which CUDA_VISIBLE_DEVICES only hides: find what wrote the spec; the plugin gives a container only its own GPUs' nodes"
	default:
		c.Summary = fmt.Sprintf("%s: a container sees exactly its %s and allocates on each, with %s unset too", what, count(len(want), "GPU"), cudaVisibleDevices)
	}
	e.add(c)
}

const cudaVisibleDevices = "CUDA_VISIBLE_DEVICES"

// runProbe runs the probe in a sandbox and reads what it printed.
func runProbe(ctx context.Context, opts cdisandbox.Options) (*cudaprobe.Result, *sandbox.Config, error) {
	out, cfg, err := cdisandbox.Run(ctx, opts)
	if err != nil {
		return nil, cfg, err
	}
	var r cudaprobe.Result
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, cfg, fmt.Errorf("%w: %v: %.200s", errProbeOutput, err, out)
	}
	return &r, cfg, nil
}

var errProbeOutput = errors.New("the probe's output is not its JSON")

// probeFailed is the check when the probe could not run or say what it
// saw.
func probeFailed(ctx context.Context, c Check, what string, timeout time.Duration, err error) Check {
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		c.Summary = fmt.Sprintf("%s: the probe did not finish within %s (--probe-timeout) and was killed", what, timeout)
		c.Details = []string{err.Error()}
		c.Fix = "cuInit or a CUDA call hung, which usually means a wedged GPU or driver: look for Xid errors in dmesg (or journalctl -k), run nvidia-smi (it hangs too on a wedged GPU), reset the GPU or reboot the node; on a healthy but slow node raise --probe-timeout"
	case errors.Is(err, sandbox.ErrRefused):
		c.Summary = what + ": the sandbox refuses the spec: " + err.Error()
		c.Fix = "the spec names a path a container must not be given (outside the container's root, through a symlink of a bound host directory, or new files in one): find what wrote it; the plugin writes no such path"
	case errors.Is(err, errProbeOutput):
		c.Summary, c.Fix = err.Error(), "run kyb-cuda-probe by hand to see what it prints"
	default:
		c.Summary, c.Fix = "the sandbox did not run: "+err.Error(), "run the doctor as root with kyb-cuda-probe beside it (--probe-binary)"
	}
	return c
}

// probeSaw are the UUIDs of the GPUs the probe saw, sorted, and whether
// it allocated on each.
func probeSaw(r *cudaprobe.Result) ([]string, bool) {
	var saw []string
	allocated := true
	for _, d := range r.Devices {
		saw = append(saw, d.UUID)
		allocated = allocated && d.MemAlloc == "ok"
	}
	slices.Sort(saw)
	return saw, allocated
}

// probeTarget is what the probe runs with: the spec files and CDI
// devices, the GPU UUIDs it must see (sorted) and who says so, a
// description for the report, and what removes the files the doctor
// wrote.
type probeTarget struct {
	specs, devices, want []string
	what, expected       string
	cleanup              func()
}

// probeTarget chooses the spec and devices to probe and the GPUs the probe
// must see.
func (e *examination) probeTarget() (probeTarget, error) {
	var t probeTarget
	if uid := e.opts.Probe.Claim; uid != "" {
		if err := cdi.CheckClaimUID(uid); err != nil {
			return t, err
		}
		// What the claim must see is what the plugin recorded when it
		// prepared it, not what its spec says: the spec is what is checked.
		want, err := e.claimGPUs(uid)
		if err != nil {
			return t, err
		}
		path := filepath.Join(e.opts.CDIRoot, cdi.SpecName(uid)+".json")
		spec, err := cdi.ReadSpecFile(path)
		if err != nil {
			return t, fmt.Errorf("claim %s: %w", uid, err)
		}
		for _, d := range spec.Devices {
			t.devices = append(t.devices, cdi.Vendor+"/"+cdi.Class+"="+d.Name)
		}
		t.specs, t.want, t.what = []string{path}, want, "claim "+string(uid)
		t.expected = fmt.Sprintf("the checkpoint records %v for the claim", want)
		return t, nil
	}
	if e.node == nil || e.files == nil {
		return t, fmt.Errorf("no seat to probe: the node or its driver files could not be examined")
	}
	group, err := e.probeGroup()
	if err != nil {
		return t, err
	}
	seat := containeredits.Seat{Group: group.Name, Seats: []int{0}, Generations: []int64{0}}
	for _, x := range group.GPUs {
		g, _ := e.node.Inv.GPUByIndex(x)
		seat.GPUs = append(seat.GPUs, *g)
		t.want = append(t.want, g.UUID)
	}
	edits, err := containeredits.Build([]containeredits.Seat{seat}, containeredits.Options{DeviceNumbers: e.node.Host.DeviceNumbers, DeviceHostRoot: e.opts.Node.DeviceHostRoot(e.opts.DriverFiles.HostDriverRoot), Driver: e.files.Source()})
	if err != nil {
		return t, fmt.Errorf("seat 0 of %s: %w", group.Name, err)
	}
	dir, err := os.MkdirTemp("", "kyb-doctor-cdi-")
	if err != nil {
		return t, err
	}
	t.cleanup = func() { _ = os.RemoveAll(dir) }
	w, err := cdi.NewWriter(dir)
	if err == nil {
		err = w.Write(probeClaimUID, []cdi.Device{{Name: "seat", Edits: edits}})
	}
	if err != nil {
		return t, fmt.Errorf("write the seat's spec: %w", err)
	}
	t.specs = []string{filepath.Join(dir, cdi.SpecName(probeClaimUID)+".json")}
	t.devices = []string{cdi.DeviceID(probeClaimUID, "seat")}
	if e.files.NVIDIACDI != nil {
		// NVIDIA's entries bring the driver files: the kubelet passes them
		// with ours.
		t.specs = append(t.specs, nvidiaSpecFiles(e.opts.CDIRoot)...)
		for _, g := range seat.GPUs {
			t.devices = append(t.devices, e.files.NVIDIACDI(g.Index, g.UUID))
		}
	}
	t.what = fmt.Sprintf("seat 0 of %s (%s)", group.Name, group.Profile.Resource)
	slices.Sort(t.want)
	t.expected = fmt.Sprintf("the seat's GPUs are %v", t.want)
	return t, nil
}

// claimGPUs are the UUIDs of the GPUs the checkpoint records for a claim,
// sorted.
func (e *examination) claimGPUs(uid types.UID) ([]string, error) {
	if e.state == nil {
		return nil, fmt.Errorf("claim %s: the plugin's checkpoint could not be read (see the checkpoint check), and only it says which GPUs the claim holds", uid)
	}
	cl := e.state.Claims[uid]
	if cl == nil {
		return nil, fmt.Errorf("claim %s is not in the plugin's checkpoint, which records %s: it is not prepared on this node, or was released since", uid, count(len(e.state.Claims), "claim"))
	}
	var want []string
	for _, d := range cl.Devices {
		for _, u := range d.GPUUUIDs {
			if !slices.Contains(want, u) {
				want = append(want, u)
			}
		}
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("claim %s/%s (%s): the checkpoint records no GPU for it", cl.Namespace, cl.Name, uid)
	}
	slices.Sort(want)
	return want, nil
}

func (e *examination) probeGroup() (*planner.Group, error) {
	groups := e.node.Plan.Groups()
	if e.opts.Probe.Group == "" {
		return groups[0], nil
	}
	var names []string
	for _, g := range groups {
		if g.Name == e.opts.Probe.Group || g.DeviceName() == e.opts.Probe.Group {
			return g, nil
		}
		names = append(names, g.Name)
	}
	return nil, fmt.Errorf("--probe-group %s: no such group; the plan has %s", e.opts.Probe.Group, strings.Join(names, ", "))
}

// nvidiaSpecFiles are the spec files NVIDIA's toolkit may have written,
// where the plugin looks for them; files it would leave out are left out.
func nvidiaSpecFiles(cdiRoot string) []string {
	return cdi.ReadSpecDirs(nodesetup.NVIDIACDIDirs(cdiRoot)).Paths()
}

// seenPath maps a host path in a spec to where the doctor sees it: device
// nodes under --dev-root, driver files under --driver-root.
func (e *examination) seenPath(p string) string {
	if strings.HasPrefix(p, "/dev/") {
		return filepath.Join(e.opts.Node.DevRoot, p)
	}
	if h := e.opts.DriverFiles.HostDriverRoot; h != "" {
		if rel, err := filepath.Rel(h, p); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(e.opts.Node.DriverRoot, rel)
		}
	}
	return p
}

func probeDetails(cfg *sandbox.Config, r *cudaprobe.Result) []string {
	out := []string{"sandbox: " + strings.Join(cfg.Targets(), " ")}
	for _, h := range cfg.Hooks {
		out = append(out, "CDI hook not run: "+h)
	}
	return append(out, r.Lines()...)
}
