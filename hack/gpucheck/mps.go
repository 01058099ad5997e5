//go:build gpucheck

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

// tryEnv makes kyb-cuda-probe try allocations of the sizes it lists; in
// the sandbox it gets no arguments.
const tryEnv = "KYB_CUDA_PROBE_TRY_ALLOC"

// mpsSeats are the seats of gpu-check's MPS group: a seat's share is a
// quarter of its GPU's memory, so that an allocation just above it fits
// the GPU by far, and only the seat's limit can refuse it.
const mpsSeats = 4

// mpsConfig is the plugin's configuration for steps 7 and 8: one MPS
// profile on one GPU that keeps its compute mode.
func mpsConfig(gpu int) string {
	return fmt.Sprintf(`profiles:
- resource: kyb.ai/gpu-1x-mps
  name: 1x-mps
  seatsPerGroup: %d
  gpus: [%d]
  sharing: {strategy: mps, mps: {computeMode: keep}}
`, mpsSeats, gpu)
}

// mpsRun is the plugin of steps 7 and 8, its MPS seat's claim, and what
// the check needs of it: the GPU, the daemons' root, and the GPU's compute
// mode before.
type mpsRun struct {
	*claimRun
	gpu    inventory.GPU
	root   string
	before string
}

// pipe is the host's pipe directory of the claim's daemon.
func (r *mpsRun) pipe() string { return filepath.Join(r.root, r.group.DeviceName(), mps.PipeDir) }

// prepareMPS is step 7: the plugin started with an MPS profile that keeps
// the compute mode on the first one-GPU group's GPU, a seat of it
// prepared over the plugin's socket, the daemon the plugin started found
// among the host's processes, and the claim's container probed: it must
// see its GPU, be refused an allocation above its seat's memory share and
// granted one below it, with the GPU's compute mode as it was.
func (c *check) prepareMPS(ctx context.Context) (outcome, error) {
	o := outcome{hardware: "the driver's nvidia-cuda-mps-control, started by the plugin; the driver's libcuda.so.1 in the claim's container, a client of its MPS server; NVML's compute mode of the GPU"}
	if c.node.Host.Simulated != nil {
		o.hardware = "the simulated node's MPS daemon (kyb-dra-plugin " + mpssim.Command + "), started by the plugin; the stand-in libcuda.so.1 in the claim's container, its client, which enforces the pinned-memory limit the daemon gives"
		o.unchecked = append(o.unchecked, "the GPU's compute mode: the plugin's simulated GPUs are its own, not those read here")
	}
	whole, err := firstOneGPUGroup(c.node.Plan)
	if err != nil {
		return o, err
	}
	r := &mpsRun{gpu: c.node.Inv.GPUs[whole.GPUs[0]], root: filepath.Join(c.work, "mps")}
	c.mps = r
	r.before = computeMode(c.node.Host.NVML, r.gpu.UUID)
	config := filepath.Join(c.work, "mps-config.yaml")
	text := mpsConfig(r.gpu.Index)
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		return o, err
	}
	o.details = append(o.details, "configuration:", strings.TrimRight(text, "\n"))
	cfg, src, err := v1alpha1.LoadNodeConfig([]byte(text), config)
	if err != nil {
		return o, err
	}
	plan, err := nodesetup.NewPlan(c.node.Inv, cfg, src)
	if err != nil {
		return o, err
	}
	group := plan.Profiles[0].Groups[0]
	dirs, err := newPluginDirs(filepath.Join(c.work, "mps-run"))
	if err != nil {
		return o, err
	}
	if err := os.Mkdir(r.root, 0o755); err != nil {
		return o, err
	}
	extra := []string{"--config", config, "--mps-root", r.root}
	if c.node.Host.Simulated != nil {
		extra = append(extra, "--mps-control", filepath.Join(c.o.bin, "kyb-dra-plugin")+" "+mpssim.Command)
	}
	r.claimRun, o.command, err = c.startClaim(ctx, dirs, plan, group, extra)
	if err != nil {
		return o, err
	}
	took, err := r.prepareClaim(ctx)
	if err != nil {
		return o, err
	}
	o.details = append(o.details, fmt.Sprintf("claim %s/%s: a seat of %s (one of %d), GPU %d %s, prepared in %s", r.claim.Namespace, r.claim.Name, group.DeviceName(), mpsSeats, r.gpu.Index, r.gpu.UUID, took.Round(time.Millisecond)))

	daemons := mpsDaemons(r.pipe())
	if len(daemons) == 0 {
		return o, fmt.Errorf("no MPS control daemon serves %s (pipe directory %s) once its claim is prepared", group.DeviceName(), r.pipe())
	}
	for _, pid := range slices.Sorted(maps.Keys(daemons)) {
		o.details = append(o.details, fmt.Sprintf("MPS control daemon: PID %d, %s", pid, daemons[pid]))
	}
	during := computeMode(c.node.Host.NVML, r.gpu.UUID)
	o.details = append(o.details, fmt.Sprintf("GPU %d's compute mode: %s before, %s while the daemon runs", r.gpu.Index, r.before, during))
	if during != r.before {
		return o, fmt.Errorf("GPU %d's compute mode changed to %s while its MPS daemon runs (%s before), though the profile keeps it", r.gpu.Index, during, r.before)
	}

	share := mps.Share(1, mpsSeats, []int64{r.gpu.MemoryMiB})
	shareMiB := share.PinnedMemMiB[0]
	above, below := uint64(shareMiB+1024)<<20, uint64(shareMiB/2)<<20
	if above >= uint64(r.gpu.MemoryMiB)<<20 {
		return o, fmt.Errorf("GPU %d has %d MiB: an allocation above a seat's share (%d MiB) would not fit it anyway", r.gpu.Index, r.gpu.MemoryMiB, shareMiB)
	}
	out, cfgSandbox, err := c.sandbox(ctx, r.claimRun, []string{fmt.Sprintf("%s=%d,%d", tryEnv, above, below)})
	if err != nil {
		return o, fmt.Errorf("probe the claim's container: %w", err)
	}
	res, err := parseProbe(out)
	if err != nil {
		return o, err
	}
	o.details = append(o.details, probeDetails(cfgSandbox, res)...)
	o.output, o.logOnly = string(out), true
	if err := seesExactly(res, []string{r.gpu.UUID}); err != nil {
		return o, err
	}
	if got := res.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; got != share.MemLimitEnv() {
		return o, fmt.Errorf("the claim's container has CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want one seat's share %q", got, share.MemLimitEnv())
	}
	d := res.Devices[0]
	o.details = append(o.details, fmt.Sprintf("free in its context: %d MiB of %d MiB", d.FreeBytes>>20, d.MemoryBytes>>20))
	if err := grantedBelowOnly(d, above, below); err != nil {
		return o, fmt.Errorf("a seat's share is %d MiB: %w", shareMiB, err)
	}
	o.summary = fmt.Sprintf("a seat of %s prepared in %s; compute mode %s kept; its container, an MPS client, is refused %d MiB and granted %d MiB (its share: %d MiB)",
		group.DeviceName(), took.Round(time.Millisecond), r.before, above>>20, below>>20, shareMiB)
	return o, nil
}

// grantedBelowOnly checks the probe's two tries: above refused, below
// granted.
func grantedBelowOnly(d cudaprobe.Device, above, below uint64) error {
	if len(d.Tries) != 2 || d.Tries[0].Bytes != above || d.Tries[1].Bytes != below {
		return fmt.Errorf("the probe tried %+v, want %d and %d bytes", d.Tries, above, below)
	}
	var errs []error
	if d.Tries[0].Result == "ok" {
		errs = append(errs, fmt.Errorf("the claim's container was granted %d MiB, above its share", above>>20))
	}
	if d.Tries[1].Result != "ok" {
		errs = append(errs, fmt.Errorf("the claim's container was refused %d MiB, below its share: %s", below>>20, d.Tries[1].Result))
	}
	return errors.Join(errs...)
}

// unprepareMPS is step 8: the MPS seat's claim unprepared, its daemon
// gone from the host's processes and its directory removed (the plugin
// removes it once the daemon has ended), the GPU's compute mode as it
// was, and the plugin stopped.
func (c *check) unprepareMPS(ctx context.Context) (outcome, error) {
	r := c.mps
	o := outcome{hardware: "the driver's nvidia-cuda-mps-control, stopped by the plugin; NVML's compute mode of the GPU"}
	if c.node.Host.Simulated != nil {
		o.hardware = "the simulated node's MPS daemon, stopped by the plugin"
	}
	if err := r.release(ctx); err != nil {
		return o, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(mpsDaemons(r.pipe())) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := mpsDaemons(r.pipe()); len(left) > 0 {
		return o, fmt.Errorf("MPS control daemons still run after the seat's release: %v", left)
	}
	dir := filepath.Dir(r.pipe())
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		return o, fmt.Errorf("the daemon's directory %s is left after its stop: %v", dir, err)
	}
	after := computeMode(c.node.Host.NVML, r.gpu.UUID)
	o.details = append(o.details, fmt.Sprintf("GPU %d's compute mode: %s before step 7, %s now", r.gpu.Index, r.before, after))
	if after != r.before {
		return o, fmt.Errorf("GPU %d's compute mode is %s after the MPS seat, %s before", r.gpu.Index, after, r.before)
	}
	if out, err := r.finish(); err != nil {
		o.output = out
		return o, err
	}
	o.summary = fmt.Sprintf("unprepared; the daemon stopped and its directory removed; compute mode %s as it was; the plugin stopped cleanly", after)
	return o, nil
}

// computeMode is a GPU's compute mode as nvidia-smi names it, or NVML's
// answer.
func computeMode(lib nvml.Interface, uuid string) string {
	dev, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret == nvml.SUCCESS {
		var mode nvml.ComputeMode
		if mode, ret = dev.GetComputeMode(); ret == nvml.SUCCESS {
			return inventory.ComputeModeName(mode)
		}
	}
	return "(" + lib.ErrorString(ret) + ")"
}

// mpsDaemons are the MPS control daemons (-f) that run with pipe as their
// pipe directory, by PID, each with its executable: found in /proc,
// whoever started them.
func mpsDaemons(pipe string) map[int]string {
	out := map[int]string{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !slices.Contains(strings.Split(string(cmdline), "\x00"), "-f") {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(dir, "stat")); err != nil || ended(stat) {
			continue
		}
		environ, err := os.ReadFile(filepath.Join(dir, "environ"))
		if err != nil || !slices.ContainsFunc(bytes.Split(environ, []byte{0}), func(kv []byte) bool { return string(kv) == "CUDA_MPS_PIPE_DIRECTORY="+pipe }) {
			continue
		}
		exe, err := os.Readlink(filepath.Join(dir, "exe"))
		if err != nil {
			exe = "(" + err.Error() + ")"
		}
		out[pid] = exe
	}
	return out
}

// ended tells a zombie's or a dead process's stat line.
func ended(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return true
	}
	f := strings.Fields(string(stat[i+1:]))
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}
