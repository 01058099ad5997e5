//go:build gpucheck

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// Without NVML there is nothing to check: one line says so, and the exit
// status is not 0.
func TestNoGPUSaysSoInOneLine(t *testing.T) {
	root := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--driver-root", root}, &stdout, &stderr)
	want := "gpu-check: no NVIDIA GPU here (libnvidia-ml.so.1 not found under driver root " + root +
		" (looked in [usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu usr/lib64 usr/lib lib64 lib/x86_64-linux-gnu])): nothing checked\n"
	if code != exitNoGPU || stdout.String() != want || stderr.Len() != 0 {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout.String(), stderr.String(), exitNoGPU, want)
	}
}

// A plan under which the plugin would change a GPU's settings is refused
// before anything runs.
func TestRefusesAPlanThatChangesSettings(t *testing.T) {
	tests := []struct {
		name, config, want string
	}{
		{"defaults", "", ""},
		{"MPS", "profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, sharing: {strategy: mps}}\n",
			"profile kyb.ai/gpu-1x-seat shares its GPUs with MPS in compute mode EXCLUSIVE_PROCESS, which changes their compute mode: gpu-check prepares no such profile (mps: {computeMode: keep} leaves it)"},
		{"MPS that keeps the compute mode", "profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, sharing: {strategy: mps, mps: {computeMode: keep}}}\n", ""},
		{"time slice", "profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, sharing: {timeSlicing: {interval: Short}}}\n",
			"profile kyb.ai/gpu-1x-seat sets a time slice (Short): gpu-check changes no GPU's time slice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := changesNoSetting(simnodetest.New(t, "dgx-h100", tc.config).Plan)
			if got := errString(err); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The binaries, built once for the tests that run the steps.
var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func binaries(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the probes' sandbox needs mount and PID namespaces: run the test as root")
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "kyb-gpu-check-bin-"); binErr != nil {
			return
		}
		build := exec.Command("go", "build", "-tags", "grpcnotrace", "-o", binDir+"/", "../../cmd/kyb-dra-plugin", "../../cmd/kyb-cuda-probe")
		if out, err := build.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("%w: %s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("build the binaries: %v", binErr)
	}
	return binDir
}

// runSimulated runs every step on a simulated dgx-h100 with the driver
// root given, and returns the exit code, what was printed and the report.
func runSimulated(t *testing.T, driverRoot string) (int, string, string) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"--simulate", "dgx-h100", "--node-name", "node-1", "--bin", binaries(t), "--out", out, "--driver-root", driverRoot, "--hold", "20s"}, &stdout, &stderr)
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatalf("exit %d, no report: %v\n%s%s", code, err, stdout.String(), stderr.String())
	}
	t.Logf("report:\n%s", report)
	if want := "gpu-check: report in " + filepath.Join(out, "report.md") + "\n"; !strings.HasSuffix(stdout.String(), want) || stderr.Len() != 0 {
		t.Errorf("stdout does not end with %q, or stderr is not empty:\n%s%s", want, stdout.String(), stderr.String())
	}
	return code, stdout.String(), string(report)
}

// Every step runs on a simulated node, with the real binaries, the
// doctor's sandbox and the doctor's stand-in libcuda: what the steps do
// and the report they write, short of the hardware.
func TestEveryStepRunsOnASimulatedNode(t *testing.T) {
	code, stdout, report := runSimulated(t, fakeDriverRoot(t, "dgx-h100", "node-1"))
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, stdout)
	}
	for _, want := range []string{
		"Result: **pass**: 13 steps",
		"Seat kinds prepared and probed: whole GPU (steps 4, 5, 6): ok; MPS, the GPU's compute mode kept (steps 7, 8): ok; MIG, read and planned only, its mode left as it is (steps 11, 12): not all checked.",
		"| 1 | NVML discovery and `kyb-dra-plugin plan` | ok |",
		"| 2 | `kyb-dra-plugin doctor` | ok |",
		"| 3 | `kyb-dra-plugin doctor --probe`: a seat's container and the real libcuda | ok |",
		"| 4 | a claim prepared over the plugin's sockets, its container probed | ok |",
		"| 5 | a CUDA context in the claim's container, as the per-pod usage sampler reads NVML | ok |",
		"| 6 | the claim unprepared | ok |",
		"| 7 | an MPS seat, the GPU's compute mode kept: its daemon started, its container probed, allocations above and below its share | ok |",
		"| 8 | the MPS seat unprepared, its daemon stopped | ok |",
		"| 9 | the health monitor registered for the GPUs' events | ok |",
		"| 10 | NVML conformance: the facts the plugin relies on, as the simulated node's tests assert them | ok |",
		"| 11 | MIG geometry as the plugin reads it, beside `nvidia-smi mig -lgip` and `-lgipp` | skipped |",
		"| 12 | the plan of a MIG profile: each MIG GPU's smallest, through `kyb-dra-plugin plan` | ok |",
		"| 13 | the GPUs' settings, before and after | ok |",
		// An H100's 81559 MiB: a quarter is 20389 MiB.
		"its container, an MPS client, is refused 21413 MiB and granted 10194 MiB (its share: 20389 MiB)",
		"env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20389M",
		"CUDA device 0: cuMemAlloc of 21413 MiB: cuMemAlloc: CUDA error 2 (out of memory)",
		"CUDA device 0: cuMemAlloc of 10194 MiB: ok",
		"free in its context: 20389 MiB of 81559 MiB",
		"/kyb-dra-plugin\nGPU 0's compute mode: Default before, Default while the daemon runs",
		"unprepared; the daemon stopped and its directory removed; compute mode Default as it was; the plugin stopped cleanly",
		"8 of 8 GPUs registered for their health events; 8 report the driver's recovery action; none unhealthy after 2s",
		"  registered for 0xc00a (DoubleBitEccError, XidCriticalError, GpuUnavailableError, GpuRecoveryAction)",
		"Not checked here: no fault was raised",
		"8x NVIDIA H100 80GB HBM3",
		"**ok** in ",
		"the probe check: seat 0 of G0 (kyb.ai/gpu-1x-seat): a container sees exactly its 1 GPU and allocates on each",
		"its container sees exactly [",
		"NVML lists the holder, PID ",
		"Which pod a process belongs to is not known here",
		"unprepared; its CDI spec removed; the plugin stopped cleanly",
		"| 0 | ",
		"| Default → Default | Disabled → Disabled | Enabled → Enabled |",
		"the checks of every simulated node's unit tests: 45 passed, 8 skipped, 0 failed",
		"What meets the hardware (here the simulated node's stand-ins): every NVML call of the suite, to the driver of 8 GPUs;",
		"Not checked here: MIG instances made and a MIG seat's container probed: that needs MIG mode on, which gpu-check does not change.",
		"pass  mig-geometry    GPU 7   MIG mode off; 8 memory slices, 7 compute slices",
		"**skipped**: not run: no nvidia-smi (a simulated node, which no nvidia-smi describes).",
		": GPU 0, 1, 2, 3, 4, 5, 6, 7 (NVIDIA H100 80GB HBM3): 7 seats of 1g.10gb each\n",
		"GPU 7 (NVIDIA H100 80GB HBM3): 7 seats of 1g.10gb\n",
		"config: profiles: - {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

// A step that fails fails the run, and the steps after it run unless they
// need what it made: with a GPU's device node gone, the probes see no GPU
// (steps 3, 4 and 7), no context can be held in the claim's container (5
// is not run), and the claims are still unprepared, the health monitor
// started and the settings compared.
func TestAFailedStepFailsTheRunNotTheStepsAfterIt(t *testing.T) {
	root := fakeDriverRoot(t, "dgx-h100", "node-1")
	if err := os.Remove(filepath.Join(root, "dev/nvidia0")); err != nil {
		t.Fatal(err)
	}
	code, stdout, report := runSimulated(t, root)
	if code != exitFailed {
		t.Errorf("exit %d, want %d", code, exitFailed)
	}
	for _, want := range []string{
		"Result: **FAIL**: step 3, 4, 7 failed",
		"Seat kinds prepared and probed: whole GPU (steps 4, 5, 6): FAIL; MPS, the GPU's compute mode kept (steps 7, 8): FAIL; MIG, read and planned only, its mode left as it is (steps 11, 12): not all checked.",
		"| 2 | `kyb-dra-plugin doctor` | ok |",
		"| 3 | `kyb-dra-plugin doctor --probe`: a seat's container and the real libcuda | FAIL |",
		"| 4 | a claim prepared over the plugin's sockets, its container probed | FAIL |",
		"| 5 | a CUDA context in the claim's container, as the per-pod usage sampler reads NVML | skipped |",
		"| 6 | the claim unprepared | ok |",
		"| 7 | an MPS seat, the GPU's compute mode kept: its daemon started, its container probed, allocations above and below its share | FAIL |",
		"| 8 | the MPS seat unprepared, its daemon stopped | ok |",
		"| 9 | the health monitor registered for the GPUs' events | ok |",
		"| 10 | NVML conformance: the facts the plugin relies on, as the simulated node's tests assert them | ok |",
		"| 13 | the GPUs' settings, before and after | ok |",
		"**FAIL** in ",
		"the claim's container sees no GPU: cuInit: CUDA error 100",
		"**skipped**: step 4 prepared no claim.",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if !strings.Contains(stdout, "gpu-check: 3 FAIL    ") || !strings.Contains(stdout, "gpu-check: 5 skipped ") {
		t.Errorf("stdout:\n%s", stdout)
	}
}

// fakeDriverRoot is a driver root holding the doctor's stand-in
// libcuda.so.1 and the node's device nodes, each a file naming its GPU,
// as the stand-in reads them in the sandbox.
func fakeDriverRoot(t *testing.T, preset, node string) string {
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	gcc := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", filepath.Join(lib, "libcuda.so.580.95.05"), "../../pkg/doctor/testdata/fakecuda.c", "-lm")
	if out, err := gcc.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in libcuda: %v: %s", err, out)
	}
	if err := os.Symlink("libcuda.so.580.95.05", filepath.Join(lib, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	_, inv := simnodetest.Inventory(t, preset, node)
	files := map[string]string{}
	for _, g := range inv.GPUs {
		files["dev/nvidia"+strconv.Itoa(g.Minor)] = g.UUID + "\n"
	}
	for _, p := range containeredits.ControlDevices {
		files[strings.TrimPrefix(p, "/")] = ""
	}
	for name, content := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// A GPU whose compute mode changed between the first step and the last is
// a failure that names it.
func TestAChangedSettingIsNamed(t *testing.T) {
	n := simnodetest.New(t, "dgx-h100", "")
	before := readSettings(n.Sim.NVML(), n.Inv)
	dev, ret := n.Sim.NVML().DeviceGetHandleByIndex(1)
	if ret != nvml.SUCCESS || dev.SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS) != nvml.SUCCESS {
		t.Fatal("set a compute mode on the simulated GPU")
	}
	got := changedSettings(before, readSettings(n.Sim.NVML(), n.Inv))
	want := []string{"GPU 1 (" + n.Inv.GPUs[1].UUID + "): compute mode Default before, Exclusive_Process after"}
	if !slices.Equal(got, want) {
		t.Errorf("changes %q, want %q", got, want)
	}
}

// An MPS seat passes only where the allocation above its share is refused
// and the one below granted.
func TestAnMPSSeatMustRefuseAboveItsShareAndGrantBelow(t *testing.T) {
	const above, below = 21413 << 20, 10194 << 20
	oom := "cuMemAlloc: CUDA error 2 (out of memory)"
	tests := []struct {
		name         string
		first, other string
		want         string
	}{
		{"as MPS does", oom, "ok", ""},
		{"no limit", "ok", "ok", "the claim's container was granted 21413 MiB, above its share"},
		{"no memory at all", oom, oom, "the claim's container was refused 10194 MiB, below its share: " + oom},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := cudaprobe.Device{Tries: []cudaprobe.Try{{Bytes: above, Result: tc.first}, {Bytes: below, Result: tc.other}}}
			if got := errString(grantedBelowOnly(d, above, below)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestEventTypesAreNamedAsNVMLNamesThem(t *testing.T) {
	for mask, want := range map[uint64]string{
		0:       "0 (none)",
		0xc00a:  "0xc00a (DoubleBitEccError, XidCriticalError, GpuUnavailableError, GpuRecoveryAction)",
		0xff9f:  "0xff9f (SingleBitEccError, DoubleBitEccError, PState, XidCriticalError, Clock, PowerSourceChange, MigConfigChange, SingleBitEccErrorStorm, DramRetirementEvent, DramRetirementFailure, NonFatalPoisonError, FatalPoisonError, GpuUnavailableError, GpuRecoveryAction)",
		0x10020: "0x10020 (0x10020)",
	} {
		if got := describeEvents(mask); got != want {
			t.Errorf("%#x: %q, want %q", mask, got, want)
		}
	}
}
