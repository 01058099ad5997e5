// Package app is the kyb-device-plugin command: its flags, their
// environment variables, and the wiring of the device-plugin shim.
// cmd/kyb-device-plugin only calls Run. The shim never talks to the API
// server; hack/deps-check.sh keeps client-go and the DRA plugin's packages
// out of its binary.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/deviceplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

const name = "kyb-device-plugin"

const usage = `Usage: kyb-device-plugin [flags]

Runs the kyb device-plugin shim on this node, for clusters without DRA:
serves each seat profile as an extended resource (kyb.ai/gpu-1x-seat, ...)
through the kubelet's device-plugin API, one device per seat; a MIG
profile's seats (kyb.ai/mig-1g.10gb) are MIG instances at fixed placements,
made at their first Allocate and kept. It reads the
same node configuration as the DRA plugin and serves its exclusive layout,
in which no GPU serves two profiles that exclude each other. A node runs
the DRA plugin or this shim, never both: each refuses to start while the
other answers on its socket, or while the kubelet's PodResources API lists
a pod holding GPUs the other handed out (drain the node to switch). Every
flag can also be set by the environment variable named beside it; a flag
given on the command line wins.

  kyb-device-plugin                                   # on a GPU node
  kyb-device-plugin --injection cdi                   # containerd 1.7+ / CRI-O 1.24+ with CDI
  kyb-device-plugin --simulate dgx-h100 --device-plugin-directory-path /tmp/dp

Flags:
`

// options are the flags of the device-plugin shim.
type options struct {
	node        nodesetup.Flags
	health      nodesetup.HealthFlags
	driverFiles nodesetup.DriverFilesFlags
	sharing     nodesetup.SharingFlags
	bootID      nodesetup.BootIDFlag

	devicePluginDir  string
	pluginsDir       string
	podResources     string
	podResourcesPoll time.Duration
	podNamespace     string
	podName          string
	cdiRoot          string
	injection        *cli.OneOf
}

func (o *options) addFlags(f *cli.FlagSet) {
	o.node.AddFlags(f, "")
	o.health.AddFlags(f)
	o.driverFiles.AddFlags(f, "shim", "how containers get the driver's libraries and tools: auto (with --injection=cdi NVIDIA's CDI spec if the node has one; else the files under --driver-root), nvidia-cdi (needs --injection=cdi), driver-root or none")
	f.StringVar(&o.devicePluginDir, "device-plugin-directory-path", "DEVICE_PLUGIN_DIRECTORY_PATH", "/var/lib/kubelet/device-plugins/", "the kubelet's device-plugin directory, holding kubelet.sock and the shim's sockets")
	f.StringVar(&o.pluginsDir, "kubelet-plugins-directory-path", "KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins", "the kubelet's plugin directory; the shim refuses to start while the DRA plugin answers in <dir>/gpu.kyb.ai")
	f.StringVar(&o.podResources, "pod-resources-socket", "POD_RESOURCES_SOCKET", podresources.DefaultSocket, "the kubelet's PodResources API: at start, that no pod holds GPUs the DRA plugin prepared and which MIG seats are held; with mps, which seats are still held. Empty: not asked (no MPS profile, and the node is known to be drained)")
	f.DurationVar(&o.podResourcesPoll, "pod-resources-poll-interval", "POD_RESOURCES_POLL_INTERVAL", 10*time.Second, "how often the shim asks the PodResources API which seats are held; an MPS daemon stops within this interval after its group's last pod")
	f.StringVar(&o.podNamespace, "pod-namespace", "POD_NAMESPACE", "", "the shim's own pod's namespace, with --pod-name: a PodResources listing without that pod is not believed (a kubelet that has just started does not know all its pods yet)")
	f.StringVar(&o.podName, "pod-name", "POD_NAME", "", "the shim's own pod's name; see --pod-namespace")
	o.sharing.AddFlags(f)
	o.bootID.AddFlags(f)
	f.StringVar(&o.cdiRoot, "cdi-root", "CDI_ROOT", "/var/run/cdi", "directory the container runtime reads CDI specs from (with --injection=cdi)")
	o.injection = cli.NewOneOf(string(deviceplugin.InjectionEnvVar), string(deviceplugin.InjectionEnvVar), string(deviceplugin.InjectionCDI))
	f.Var(o.injection, "injection", "KYB_INJECTION", "how containers get their seats: envvar (environment, device nodes and driver mounts in the Allocate response; any runtime) or cdi (a CDI spec per container, named in the response; runtimes with CDI)")
}

// Run is the kyb-device-plugin command; it returns the exit code.
func Run(ctx context.Context, args []string, getenv func(string) string, _, stderr io.Writer) int {
	f := cli.NewFlagSet(name, stderr)
	var o options
	o.addFlags(f)
	return cli.RunDaemon(f, usage, args, getenv, o.check, func() error { return o.run(ctx) })
}

func (o *options) check() error {
	for _, d := range []struct{ flag, path string }{
		{"--device-plugin-directory-path", o.devicePluginDir},
		{"--kubelet-plugins-directory-path", o.pluginsDir},
		{"--cdi-root", o.cdiRoot},
	} {
		if !filepath.IsAbs(d.path) {
			return fmt.Errorf("%s %q must be an absolute path", d.flag, d.path)
		}
	}
	if o.podResources != "" && !filepath.IsAbs(o.podResources) {
		return fmt.Errorf("--pod-resources-socket %q must be an absolute path (or empty: not asked)", o.podResources)
	}
	if (o.podName == "") != (o.podNamespace == "") {
		return errors.New("--pod-name and --pod-namespace go together: they name the shim's own pod")
	}
	if o.podResourcesPoll <= 0 {
		return fmt.Errorf("--pod-resources-poll-interval %s must be positive", o.podResourcesPoll)
	}
	if o.driverFiles.Mode.Value() == nodesetup.DriverFilesNVIDIACDI && o.injection.Value() != string(deviceplugin.InjectionCDI) {
		return errors.New("--driver-files=nvidia-cdi needs --injection=cdi: NVIDIA's CDI entries reach a container only as CDI devices")
	}
	return o.health.Check(&o.node)
}

func (o *options) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	node, err := o.node.Open(ctx)
	if err != nil {
		return err
	}
	defer node.Close(ctx)
	node.LogPlan(ctx)
	injection := deviceplugin.Injection(o.injection.Value())
	files, err := o.driverFiles.ChooseDriverFiles(ctx, node, &o.node, o.cdiRoot, injection == deviceplugin.InjectionCDI)
	if err != nil {
		return err
	}
	// A failed Allocate fails its pod for good (the kubelet does not
	// retry it, unlike a DRA prepare): a driver root that must hold the
	// driver and does not is refused here, while the seats are not
	// offered yet.
	if src := files.Source(); src != nil && files.Mode == nodesetup.DriverFilesDriverRoot {
		if _, err := src.Files(); err != nil {
			return fmt.Errorf("--driver-files=driver-root: %w", err)
		}
	}
	// The shim has no API client: health changes show in ListAndWatch and
	// in the monitor's log.
	mon, stopHealth, err := nodesetup.StartHealth(ctx, node, o.health)
	if err != nil {
		return err
	}
	defer stopHealth()
	bootID, err := o.bootID.Read()
	if err != nil {
		return err
	}
	// The kubelet's PodResources API is dialled lazily, so a kubelet that
	// restarts later is found when it comes.
	var pr *podresources.Client
	if o.podResources != "" {
		if pr, err = podresources.NewClient(o.podResources); err != nil {
			return err
		}
		defer pr.Close()
	}
	sharing, err := o.shimSharing(ctx, node, pr, bootID)
	if err != nil {
		return err
	}
	opts := deviceplugin.Options{
		NodeName:          o.node.NodeName,
		Inventory:         node.Inv,
		Plan:              node.Plan,
		Edits:             containeredits.Options{DeviceNumbers: node.Host.DeviceNumbers, DeviceHostRoot: o.node.DeviceHostRoot(o.driverFiles.HostDriverRoot), Driver: files.Source()},
		NVIDIACDIDevice:   files.NVIDIACDI,
		Injection:         injection,
		CDIRoot:           o.cdiRoot,
		DevicePluginDir:   o.devicePluginDir,
		KubeletPluginsDir: o.pluginsDir,
		Health:            mon,
		Sharing:           sharing,
		// The journal of the MIG instances lives where the DRA plugin
		// keeps its own: a node moved to the DRA plugin destroys the
		// shim's instances, whose seats no claim holds.
		MIG: deviceplugin.MIG{NVML: node.Host.NVML, Minors: node.Host.MIGMinors, Dir: driver.PluginDir(o.pluginsDir), BootID: bootID},
	}
	if pr != nil {
		opts.PodResources = pr.List
	}
	p, err := deviceplugin.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer p.Stop()
	<-ctx.Done()
	logger.Info("Shutting down; removing the shim's sockets")
	return nil
}

// shimSharing is how the shim applies the profiles' sharing strategies.
// MPS daemons need the kubelet's PodResources API (pr), where the shim
// learns that a group's last seat was released (the device-plugin API
// never says); bootID is the node's.
func (o *options) shimSharing(ctx context.Context, node *nodesetup.Node, pr *podresources.Client, bootID string) (deviceplugin.Sharing, error) {
	hw, err := o.sharing.Hardware(ctx, node, driver.PluginDir(o.pluginsDir), o.node.DriverRoot, bootID)
	if err != nil {
		return deviceplugin.Sharing{}, err
	}
	s := deviceplugin.Sharing{Hardware: hw}
	if hw.MPS == nil {
		return s, nil
	}
	if pr == nil {
		return s, errors.New("--pod-resources-socket is empty, and MPS needs the kubelet's PodResources API: the shim learns there that a group's last seat was released")
	}
	klog.FromContext(ctx).Info("MPS daemons stop when the kubelet no longer lists their seats", "podResourcesSocket", o.podResources)
	s.Assigned, s.Poll = pr.List, o.podResourcesPoll
	if o.podName != "" {
		s.Self = o.podNamespace + "/" + o.podName
	}
	return s, nil
}
