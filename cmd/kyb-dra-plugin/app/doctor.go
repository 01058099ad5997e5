package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/doctor"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

const doctorUsage = `Usage: kyb-dra-plugin doctor [flags]

Examines this node as the plugin would serve it and says, check by check,
ok, warn or fail, and what to do: NVML and the driver, the GPUs and their
links, the configuration and plan, the driver files a container would get,
NVIDIA's CDI spec, the CDI directory, the kubelet's plugin directories, the
container runtime's CDI setting, the plugin's checkpoint, the sized
profiles' groups (what each publishes, what its claims hold, and whether
its MPS daemon holds the largest size held), and with
--pod-resources-socket whether pods of the device-plugin shim still hold
GPUs (drain them before the plugin takes the node over). With --probe it
also runs a CUDA probe in a sandbox built only from a seat's CDI spec: what
a container holding that seat would see. The probe is killed when it
takes longer than --probe-timeout (a wedged GPU hangs cuInit), and the
check fails saying so. Every other step is bounded by --check-timeout: a
read that never returns fails its checks, and the doctor goes on.

It reads and never writes the node's state, and needs no API server: safe
beside a running plugin. The exit status is 1 when a check fails.

  kyb-dra-plugin doctor                                  # on a GPU node
  kyb-dra-plugin doctor --simulate dgx-h100 -o json
  kyb-dra-plugin doctor --probe                          # as root

It takes the plugin's flags and environment variables, so that an init
container beside the plugin examines what the plugin will use.

Flags:
`

// Doctor runs the doctor subcommand and returns its exit code.
func Doctor(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	f := cli.NewFlagSet("kyb-dra-plugin doctor", stderr)
	var opts doctor.Options
	opts.Node.AddFlags(f, "")
	opts.DriverFiles.AddFlags(f, "plugin", "how the plugin would give containers the driver's files: auto, nvidia-cdi, driver-root or none")
	var d dirs
	d.addFlags(f)
	var bootID nodesetup.BootIDFlag
	bootID.AddFlags(f)
	f.StringVar(&opts.PodResourcesSocket, "pod-resources-socket", "POD_RESOURCES_SOCKET", "", "the kubelet's PodResources API, as the plugin's flag: where set, whether pods of the device-plugin shim still hold GPUs (the plugin refuses to take the node over until it is drained of them); empty: not asked")
	f.StringVar(&opts.MPSRoot, "mps-root", "KYB_MPS_ROOT", "", "the plugin's --mps-root: where the records of its MPS daemons are, whose limits the sized-seats check holds against the sizes held; default: <plugin directory>/mps")
	f.StringVar(&opts.HostRoot, "host-root", "KYB_HOST_ROOT", "/", "where the host's root file system is, as the doctor sees it; the container runtime's configuration is read under it")
	f.StringVar(&opts.ContainerdConfig, "containerd-config", "KYB_CONTAINERD_CONFIG", "/etc/containerd/config.toml", "containerd's configuration file on the host")
	f.StringVar(&opts.CRIOConfig, "crio-config", "KYB_CRIO_CONFIG", "/etc/crio/crio.conf", "CRI-O's configuration file on the host; its drop-ins in <file>.d are read too")
	output := cli.NewOneOf("table", "table", "json")
	f.Var(output, "o", "", "output format: table or json")
	f.Var(output, "output", "", "same as -o")
	var reportOnly bool
	f.BoolVar(&reportOnly, "report-only", "KYB_DOCTOR_REPORT_ONLY", false, "print the report and exit 0 even when a check fails (an init container that must not block the plugin)")
	f.DurationVar(&opts.CheckTimeout, "check-timeout", "KYB_DOCTOR_CHECK_TIMEOUT", doctor.DefaultCheckTimeout, "how long each step of the examination may take before its checks fail (a read that never returns: a FIFO where a file belongs, a hung file system, a wedged driver); the probe's step gets --probe-timeout on top")
	var probe probeFlags
	probe.addFlags(f)
	if code, ok := f.ParseOrExit(args, getenv, doctorUsage); !ok {
		return code
	}
	if err := d.check(); err != nil {
		return f.Fail(cli.ExitUsage, err)
	}
	if opts.CheckTimeout <= 0 {
		return f.Fail(cli.ExitUsage, fmt.Errorf("--check-timeout %s must be positive", opts.CheckTimeout))
	}
	if opts.Node.NodeName == "" {
		// Simulated GPUs' UUIDs derive from the node name: the plugin's
		// NODE_NAME, or this host's name by hand.
		opts.Node.NodeName, _ = os.Hostname()
	}
	opts.CDIRoot, opts.PluginsDir, opts.RegistrarDir, opts.DevicePluginDir = d.cdiRoot, d.pluginsDir, d.registrarDir, d.devicePluginDir
	var err error
	if opts.BootID, err = bootID.Read(); err != nil {
		return f.Fail(cli.ExitUsage, err)
	}
	if opts.Probe, err = probe.options(); err != nil {
		return f.Fail(cli.ExitUsage, err)
	}
	// The report says what the checks found; their logs would only repeat
	// it on stderr.
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).V(4))
	report := doctor.Run(ctx, opts)
	write := doctor.WriteTable
	if output.Value() == "json" {
		write = doctor.WriteJSON
	}
	if err := write(stdout, report); err != nil {
		return f.Fail(cli.ExitFailed, err)
	}
	if report.Failed() && !reportOnly {
		return cli.ExitFailed
	}
	return cli.ExitOK
}

// probeFlags are the doctor's --probe flags.
type probeFlags struct {
	probe   bool
	program string
	claim   string
	group   string
	timeout time.Duration
}

func (p *probeFlags) addFlags(f *cli.FlagSet) {
	f.BoolVar(&p.probe, "probe", "", false, "also run the CUDA probe in a sandbox built only from a seat's CDI spec (needs root)")
	f.StringVar(&p.program, "probe-binary", "", "", "the probe program; default: kyb-cuda-probe beside this binary")
	f.StringVar(&p.claim, "probe-claim", "", "", "probe this prepared claim's spec (its UID) instead of seat 0 of --probe-group")
	f.StringVar(&p.group, "probe-group", "", "", "the group whose seat 0 is probed, by name (G01) or device (g01-1x); default: the plan's first")
	f.DurationVar(&p.timeout, "probe-timeout", "", doctor.DefaultProbeTimeout, "how long the probe may run before it is killed and the check fails (a wedged GPU or driver hangs cuInit)")
}

// options returns the probe's options, nil without --probe.
func (p *probeFlags) options() (*doctor.ProbeOptions, error) {
	if !p.probe {
		if p.program != "" || p.claim != "" || p.group != "" || p.timeout != doctor.DefaultProbeTimeout {
			return nil, errors.New("--probe-binary, --probe-claim, --probe-group and --probe-timeout need --probe")
		}
		return nil, nil
	}
	if p.timeout <= 0 {
		return nil, fmt.Errorf("--probe-timeout %s must be positive", p.timeout)
	}
	if p.claim != "" && p.group != "" {
		return nil, errors.New("--probe-claim and --probe-group exclude each other: a claim's spec names its group")
	}
	program := p.program
	if program == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find kyb-cuda-probe beside this binary: %w (set --probe-binary)", err)
		}
		program = filepath.Join(filepath.Dir(self), "kyb-cuda-probe")
	}
	if _, err := os.Stat(program); err != nil {
		return nil, fmt.Errorf("--probe-binary: %w", err)
	}
	return &doctor.ProbeOptions{Program: program, Claim: types.UID(p.claim), Group: p.group, Timeout: p.timeout}, nil
}
