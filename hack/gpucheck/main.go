//go:build gpucheck

// Command gpucheck is make gpu-check: on a machine with an NVIDIA GPU and
// its driver, it runs what must meet real hardware, one step after the
// other, and writes one report (markdown):
//
//  1. NVML discovery and `kyb-dra-plugin plan`, without --simulate;
//  2. `kyb-dra-plugin doctor`;
//  3. `kyb-dra-plugin doctor --probe`, through the real libcuda (root);
//  4. a claim for a seat of the node's first one-GPU group, prepared over
//     the plugin's real gRPC sockets (the plugin started as its command
//     line starts it, on real NVML, with a fake API server and this
//     program as the kubelet), and what its container sees, probed in the
//     doctor's sandbox with the CDI devices the kubelet would pass;
//  5. a process holding a CUDA context in that container, as the per-pod
//     usage sampler reads it from NVML;
//  6. the claim unprepared;
//  7. an MPS seat through the plugin's own path, of a profile that keeps
//     the GPU's compute mode: the plugin started again with it, the
//     claim prepared, the daemon it started (the driver's
//     nvidia-cuda-mps-control) found, and the claim's container probed:
//     an allocation above the seat's memory share refused, one below it
//     granted;
//  8. the MPS claim unprepared and its daemon stopped;
//  9. the plugin's health monitor started on the GPUs for a moment: the
//     events each GPU supports and those it registered for;
//  10. the NVML conformance suite (pkg/nvmlconformance), which the unit
//     tests run on every simulated node, on this node's NVML;
//  11. the MIG geometry the plugin read beside `nvidia-smi mig -lgip` and
//     `-lgipp` (not run without nvidia-smi, nor on a simulated node);
//  12. `kyb-dra-plugin plan` with each MIG GPU's smallest MIG profile, and
//     the seats per GPU (MIG mode is not changed: nothing is prepared);
//  13. the GPUs' settings, before and after.
//
// It changes no setting of the GPUs: the plan is the defaults', which it
// checks has no MPS profile that sets compute modes and no time slice;
// step 7's MPS profile keeps the compute mode; the plugin has no code
// that changes MIG modes or resets a GPU, and the MIG steps read and
// plan, and make no instance. It reads each GPU's compute, MIG and
// persistence modes before and after, and fails when any changed. A
// failed step does not stop the next ones unless they need what it made;
// the exit status is 1 when a step failed, 2 when there is no GPU to
// check (one line says why).
//
// --simulate runs the same steps on a simulated node (its test does, with
// the doctor's stand-in libcuda); it is not for checking hardware.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// options are gpucheck's flags.
type options struct {
	bin, out string
	node     nodesetup.Flags
	hold     time.Duration
}

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	// exitNoGPU: nothing was checked.
	exitNoGPU = 2
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpu-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	host, _ := os.Hostname()
	fs.StringVar(&o.bin, "bin", "", "directory holding kyb-dra-plugin and kyb-cuda-probe")
	fs.StringVar(&o.out, "out", "_output/gpu-check", "directory the report and the logs are written to")
	fs.StringVar(&o.node.NodeName, "node-name", host, "the node's name, as the plugin is told")
	fs.StringVar(&o.node.DriverRoot, "driver-root", "/", "where the NVIDIA driver's files are (the plugin's --driver-root)")
	fs.DurationVar(&o.hold, "hold", 20*time.Second, "how long the process of step 5 may hold its CUDA context while NVML is sampled")
	fs.StringVar(&o.node.Simulate, "simulate", "", "run on a simulated node instead (gpucheck's own test; checks no hardware)")
	if err := fs.Parse(args); err != nil {
		return exitNoGPU
	}
	o.node.DevRoot, o.node.SysfsRoot = "/", "/sys"
	if reason := noGPU(ctx, &o.node); reason != "" {
		fmt.Fprintf(stdout, "gpu-check: no NVIDIA GPU here (%s): nothing checked\n", reason)
		return exitNoGPU
	}
	for _, p := range []string{"kyb-dra-plugin", "kyb-cuda-probe"} {
		if _, err := os.Stat(filepath.Join(o.bin, p)); err != nil || o.bin == "" {
			fmt.Fprintf(stderr, "gpu-check: --bin %q must hold %s (make build): %v\n", o.bin, p, err)
			return exitFailed
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		fmt.Fprintf(stderr, "gpu-check: %v\n", err)
		return exitFailed
	}
	logFile, err := os.Create(filepath.Join(o.out, "plugin.log"))
	if err != nil {
		fmt.Fprintf(stderr, "gpu-check: %v\n", err)
		return exitFailed
	}
	defer func() { _ = logFile.Close() }()
	ctx = klog.NewContext(ctx, textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(2))))

	c, err := newCheck(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-check: %v\n", err)
		return exitFailed
	}
	defer c.close(ctx)
	c.runSteps(ctx)
	path := filepath.Join(o.out, "report.md")
	if err := c.report.write(path); err != nil {
		fmt.Fprintf(stderr, "gpu-check: %v\n", err)
		return exitFailed
	}
	c.report.summary(stdout)
	fmt.Fprintf(stdout, "gpu-check: report in %s\n", path)
	if c.report.failed() {
		return exitFailed
	}
	return exitOK
}

// noGPU says why this machine has no GPU to check, "" when it has one:
// NVML does not open (no driver, or no libnvidia-ml.so.1), or sees none.
func noGPU(ctx context.Context, node *nodesetup.Flags) string {
	host, err := node.OpenHost(ctx)
	if err != nil {
		// The loader found no library where it looks: the one line says
		// so, not what the plugin would advise its operator.
		if node.Simulate == "" && (node.DriverRoot == "" || node.DriverRoot == "/") {
			lib := nvml.New()
			ret := lib.Init()
			if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
				return "libnvidia-ml.so.1 not found"
			}
			if ret == nvml.SUCCESS {
				_ = lib.Shutdown()
			}
		}
		return err.Error()
	}
	defer func() { _ = host.Close() }()
	n, ret := host.NVML.DeviceGetCount()
	if err := nvmlError(host.NVML, ret); err != nil {
		return "NVML cannot count the GPUs: " + err.Error()
	}
	if n == 0 {
		return "NVML reports 0 GPUs"
	}
	return ""
}
