// Package app is the kyb-dra-plugin command: its flags, their environment
// variables, and the wiring of the DRA kubelet plugin. Run serves the node;
// `plan` prints what it would publish. cmd/kyb-dra-plugin only calls Run,
// so that the command line is tested like any other code.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime/debug"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cri"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sharedseats"
)

const name = "kyb-dra-plugin"

const usage = `Usage: kyb-dra-plugin [flags]
       kyb-dra-plugin plan [flags]
       kyb-dra-plugin doctor [flags]

Runs the kyb DRA kubelet plugin (driver gpu.kyb.ai) on this node: publishes
its GPU groups and seats as ResourceSlices and prepares the claims allocated
on them. Every flag can also be set by the environment variable named
beside it; a flag given on the command line wins.

  kyb-dra-plugin --node-name "$NODE_NAME"                    # on a GPU node
  kyb-dra-plugin --simulate dgx-h100 --kubeconfig ~/.kube/config --node-name node-1

'kyb-dra-plugin plan -h' and 'kyb-dra-plugin doctor -h' describe the
subcommands: what the plugin would publish here, and whether this node is
ready for it.

Flags:
`

// options are the flags of the node plugin.
type options struct {
	node        nodesetup.Flags
	health      nodesetup.HealthFlags
	driverFiles nodesetup.DriverFilesFlags
	sharing     nodesetup.SharingFlags
	usage       nodesetup.UsageFlags

	dirs      dirs
	api       apiFlags
	endpoints endpoints

	podUID         string
	layout         *cli.OneOf
	bootID         nodesetup.BootIDFlag
	deviceMetadata bool
	// Node-local sources of which containers hold which claims.
	podResourcesSocket string
	runtimeSocket      string
}

// dirs are the node directories the plugin uses, which the doctor examines.
type dirs struct {
	cdiRoot      string
	registrarDir string
	pluginsDir   string
	// devicePluginDir is where a live device-plugin shim makes the plugin
	// refuse to start.
	devicePluginDir string
}

func (d *dirs) addFlags(f *cli.FlagSet) {
	f.StringVar(&d.cdiRoot, "cdi-root", "CDI_ROOT", "/var/run/cdi", "directory the container runtime reads CDI specs from")
	f.StringVar(&d.registrarDir, "kubelet-registrar-directory-path", "KUBELET_REGISTRAR_DIRECTORY_PATH", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration directory")
	f.StringVar(&d.pluginsDir, "kubelet-plugins-directory-path", "KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins", "the kubelet's plugin directory; the plugin keeps its socket and checkpoint in <dir>/"+driver.Name)
	f.StringVar(&d.devicePluginDir, "device-plugin-directory-path", "DEVICE_PLUGIN_DIRECTORY_PATH", "/var/lib/kubelet/device-plugins/", "the kubelet's device-plugin directory; the plugin refuses to start while the kyb device-plugin shim answers there")
}

func (d *dirs) check() error {
	for _, x := range []struct{ flag, path string }{
		{"--cdi-root", d.cdiRoot},
		{"--kubelet-registrar-directory-path", d.registrarDir},
		{"--kubelet-plugins-directory-path", d.pluginsDir},
		{"--device-plugin-directory-path", d.devicePluginDir},
	} {
		if !filepath.IsAbs(x.path) {
			return fmt.Errorf("%s %q must be an absolute path", x.flag, x.path)
		}
	}
	return nil
}

func (o *options) addFlags(f *cli.FlagSet) {
	o.node.AddFlags(f, "")
	o.health.AddFlags(f)
	o.driverFiles.AddFlags(f, "plugin", "how containers get the driver's libraries and tools: auto (NVIDIA's CDI spec if the node has one, else the files under --driver-root), nvidia-cdi, driver-root or none")
	o.api.addFlags(f)
	o.dirs.addFlags(f)
	o.sharing.AddFlags(f)
	o.usage.AddFlags(f)
	o.endpoints.addFlags(f)
	f.StringVar(&o.podUID, "pod-uid", "POD_UID", "", "UID of the plugin's pod; enables seamless rolling updates (kubelet 1.33 or newer)")
	o.layout = cli.NewOneOf(string(draplugin.LayoutAuto), string(draplugin.LayoutAuto), string(draplugin.LayoutShared), string(draplugin.LayoutPerSeat))
	f.Var(o.layout, "device-layout", "KYB_DEVICE_LAYOUT", "ResourceSlice layout: auto (shared groups, one device per seat where the API server lacks consumable capacity), shared or per-seat")
	f.BoolVar(&o.deviceMetadata, "device-metadata", "KYB_DEVICE_METADATA", true, "give containers each prepared device's attributes, seats, seat generations and GPU UUIDs in a metadata file (KEP-5304) under /var/run/kubernetes.io/dra-device-attributes/")
	o.bootID.AddFlags(f)
	f.StringVar(&o.podResourcesSocket, "pod-resources-socket", "POD_RESOURCES_SOCKET", podresources.DefaultSocket,
		"the kubelet's PodResources API: at start, that no pod holds GPUs of the device-plugin shim; which claims each container of a pod references, so that a claim alone in its containers names its own GPUs (and, for the per-pod GPU metrics, a container's claims where it has no device metadata); empty: not asked, the node is known to be drained of the shim's pods, and claims that may share a container name GPUs by index")
	f.StringVar(&o.runtimeSocket, "container-runtime-socket", "KYB_CONTAINER_RUNTIME_SOCKET", "/run/containerd/containerd.sock",
		"the container runtime's CRI socket (containerd: /run/containerd/containerd.sock, CRI-O: /var/run/crio/crio.sock), where the per-pod GPU metrics find the pod and container of a GPU process's container ID; empty: no process is given to a pod")
}

// Run is the kyb-dra-plugin command: the node plugin, or `plan`. It
// returns the exit code.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	return runCommand(ctx, nil, args, getenv, stdout, stderr)
}

// Clients are the node plugin's API clients: one for the prepare path,
// one for the work behind the calls.
type Clients struct {
	Prepare, Background kubernetes.Interface
}

// RunWithClients is Run with the API clients given instead of made from
// --kubeconfig: the node plugin exactly as the command line starts it,
// for a caller that serves it an API of its own. make gpu-check prepares
// a claim on a real node that way, with no cluster.
func RunWithClients(ctx context.Context, clients Clients, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	return runCommand(ctx, &clients, args, getenv, stdout, stderr)
}

func runCommand(ctx context.Context, clients *Clients, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "plan":
			return Plan(ctx, args[1:], getenv, stdout, stderr)
		case "doctor":
			return Doctor(ctx, args[1:], getenv, stdout, stderr)
		}
	}
	f := cli.NewFlagSet(name, stderr)
	o := options{api: apiFlags{given: clients}}
	o.addFlags(f)
	return cli.RunDaemon(f, usage, args, getenv, o.check, func() error {
		if getenv("GOGC") == "" {
			debug.SetGCPercent(pluginGCPercent)
		}
		return o.run(ctx)
	})
}

// pluginGCPercent is the plugin's GOGC where the environment sets none.
// Its live heap is a few MiB, so at Go's default of 100 the garbage kept
// between collections is as large as everything it holds: the footprint
// study (docs/performance.md) measured 3–4 MiB more resident memory after
// a thousand prepares, for a collection every ~1.5 MiB allocated at 50,
// a few dozen prepares.
const pluginGCPercent = 50

func (o *options) check() error {
	if o.node.NodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required: the name of the Kubernetes node the plugin serves")
	}
	if err := o.dirs.check(); err != nil {
		return err
	}
	for _, x := range []struct{ flag, path string }{{"--pod-resources-socket", o.podResourcesSocket}, {"--container-runtime-socket", o.runtimeSocket}} {
		if x.path != "" && !filepath.IsAbs(x.path) {
			return fmt.Errorf("%s %q must be an absolute path (or empty: off)", x.flag, x.path)
		}
	}
	if err := o.endpoints.check(); err != nil {
		return err
	}
	if err := o.usage.Check(&o.node); err != nil {
		return err
	}
	return o.health.Check(&o.node)
}

func (o *options) run(ctx context.Context) error {
	// One node runs the DRA plugin or the device-plugin shim, never both.
	if err := driver.CheckNoLiveShim(o.dirs.devicePluginDir); err != nil {
		return err
	}
	client, background, err := o.api.clients()
	if err != nil {
		return err
	}
	node, err := o.node.Open(ctx)
	if err != nil {
		return err
	}
	defer node.Close(ctx)
	node.LogPlan(ctx)
	var pr *podresources.Client
	if o.podResourcesSocket != "" {
		if pr, err = podresources.NewClient(o.podResourcesSocket); err != nil {
			return err
		}
		defer pr.Close()
	}
	if err := checkShimDrained(ctx, pr, node.Plan, driver.PluginDir(o.dirs.pluginsDir)); err != nil {
		return err
	}

	mon, stopHealth, err := nodesetup.StartHealth(ctx, node, o.health)
	if err != nil {
		return err
	}
	defer stopHealth()
	files, err := o.driverFiles.ChooseDriverFiles(ctx, node, &o.node, o.dirs.cdiRoot, true)
	if err != nil {
		return err
	}
	bootID, err := o.bootID.Read()
	if err != nil {
		return err
	}
	hw, err := o.sharing.Hardware(ctx, node, driver.PluginDir(o.dirs.pluginsDir), o.node.DriverRoot, bootID)
	if err != nil {
		return err
	}
	opts := draplugin.Options{
		Sharing:          sharedseats.Options{Hardware: hw},
		MIG:              migseats.Options{NVML: node.Host.NVML, Minors: node.Host.MIGMinors},
		NodeName:         o.node.NodeName,
		Client:           client,
		BackgroundClient: background,
		Inventory:        node.Inv,
		Plan:             node.Plan,
		Containers: draplugin.ContainerOptions{
			Edits:           containeredits.Options{DeviceNumbers: node.Host.DeviceNumbers, DeviceHostRoot: o.node.DeviceHostRoot(o.driverFiles.HostDriverRoot), Driver: files.Source()},
			NVIDIACDIDevice: files.NVIDIACDI,
		},
		Dirs:           draplugin.Dirs{CDI: o.dirs.cdiRoot, PluginData: driver.PluginDir(o.dirs.pluginsDir), Registrar: o.dirs.registrarDir},
		PodUID:         types.UID(o.podUID),
		BootID:         bootID,
		Layout:         draplugin.LayoutMode(o.layout.Value()),
		DeviceMetadata: o.deviceMetadata,
		Health:         draplugin.HealthOptions{Source: mon, Collector: mon.Collector()},
	}
	if pr != nil {
		opts.PodResources = pr
	}
	if o.endpoints.metricsAddress != "" {
		// Only the metrics show what is sampled.
		opts.Usage = podusage.Options{Sampler: o.usage.Sampler(node), Interval: o.usage.Interval, Mounts: gpuusage.ProcMounts{Root: o.usage.HostProc}}
		if opts.Usage.Sampler != nil && o.runtimeSocket != "" {
			containers, err := cri.NewClient(o.runtimeSocket)
			if err != nil {
				return err
			}
			defer containers.Close()
			opts.Usage.Containers = containers
		}
	}
	if h := node.Config.Health; h != nil {
		opts.Health.LostEffect = resourceapi.DeviceTaintEffect(h.GPULostEffect)
	}
	d, err := draplugin.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer d.Stop()
	return o.endpoints.serve(ctx, d)
}
