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
	"net"
	"net/http"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cri"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
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

	dirs dirs

	kubeconfig   string
	kubeAPIQPS   float64
	kubeAPIBurst int
	// The background client's limits: claim statuses, events, slices.
	backgroundQPS   float64
	backgroundBurst int
	healthPort      int
	healthAddress   string
	metricsAddress  string
	podUID          string
	layout          *cli.OneOf
	bootID          nodesetup.BootIDFlag
	deviceMetadata  bool
	// Node-local sources of which containers hold which claims.
	podResourcesSocket string
	runtimeSocket      string

	// clients, when set, are used instead of --kubeconfig's.
	clients *Clients
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
	f.StringVar(&o.kubeconfig, "kubeconfig", "KUBECONFIG", "", "kubeconfig file; empty: in-cluster configuration")
	f.Float64Var(&o.kubeAPIQPS, "kube-api-qps", "KUBE_API_QPS", DefaultPrepareQPS, "queries per second to the API server on the prepare path (a claim GET per prepared claim)")
	f.IntVar(&o.kubeAPIBurst, "kube-api-burst", "KUBE_API_BURST", DefaultPrepareBurst, "burst of queries to the API server on the prepare path: claims a node prepares at once without waiting for the rate limiter")
	f.Float64Var(&o.backgroundQPS, "kube-api-background-qps", "KUBE_API_BACKGROUND_QPS", DefaultBackgroundQPS, "queries per second to the API server for work behind the calls: claim statuses, events, ResourceSlices")
	f.IntVar(&o.backgroundBurst, "kube-api-background-burst", "KUBE_API_BACKGROUND_BURST", DefaultBackgroundBurst, "burst of queries to the API server for work behind the calls")
	o.dirs.addFlags(f)
	o.sharing.AddFlags(f)
	o.usage.AddFlags(f)
	f.IntVar(&o.healthPort, "healthcheck-port", "HEALTHCHECK_PORT", -1, "port of the gRPC health service (liveness probe); -1: off")
	f.StringVar(&o.healthAddress, "healthcheck-address", "HEALTHCHECK_ADDRESS", "127.0.0.1", "IP address the gRPC health service listens on; the kubelet's gRPC probes dial the pod IP, so a chart sets it from status.podIP")
	f.StringVar(&o.metricsAddress, "metrics-address", "METRICS_ADDRESS", "", "address of the Prometheus metrics endpoint (/metrics), such as :8080; empty: off")
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
	o := options{clients: clients}
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
	if o.healthPort < -1 || o.healthPort > 65535 {
		return fmt.Errorf("--healthcheck-port %d is not a port (or -1 for off)", o.healthPort)
	}
	if net.ParseIP(o.healthAddress) == nil {
		return fmt.Errorf("--healthcheck-address %q is not an IP address", o.healthAddress)
	}
	if o.metricsAddress != "" {
		if _, _, err := net.SplitHostPort(o.metricsAddress); err != nil {
			return fmt.Errorf("--metrics-address %q: %w", o.metricsAddress, err)
		}
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
	client, background, err := o.kubeClients()
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
	if err := checkShimDrained(ctx, pr, node.Plan); err != nil {
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
	mpsManager, err := o.sharing.MPSManager(ctx, node, driver.PluginDir(o.dirs.pluginsDir), o.node.DriverRoot, bootID)
	if err != nil {
		return err
	}
	opts := draplugin.Options{
		Sharing:          draplugin.Sharing{MPS: mpsManager, SetTimeSlice: node.Host.SetTimeSlice},
		MIG:              draplugin.MIG{NVML: node.Host.NVML, Minors: node.Host.MIGMinors},
		NodeName:         o.node.NodeName,
		Client:           client,
		BackgroundClient: background,
		Inventory:        node.Inv,
		Plan:             node.Plan,
		Edits:            containeredits.Options{DeviceNumbers: node.Host.DeviceNumbers, DeviceHostRoot: o.node.DeviceHostRoot(o.driverFiles.HostDriverRoot), Driver: files.Source()},
		NVIDIACDIDevice:  files.NVIDIACDI,
		CDIRoot:          o.dirs.cdiRoot,
		PluginDataDir:    driver.PluginDir(o.dirs.pluginsDir),
		RegistrarDir:     o.dirs.registrarDir,
		PodUID:           types.UID(o.podUID),
		BootID:           bootID,
		Layout:           draplugin.LayoutMode(o.layout.Value()),
		DeviceMetadata:   o.deviceMetadata,
		Health:           mon,
		Collectors:       []prometheus.Collector{mon.Collector()},
	}
	if pr != nil {
		opts.PodResources = pr
	}
	if o.metricsAddress != "" {
		// Only the metrics show what is sampled.
		opts.Usage = draplugin.PodUsage{Sampler: o.usage.Sampler(node), Interval: o.usage.Interval, Mounts: gpuusage.ProcMounts{Root: o.usage.HostProc}}
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
		opts.GPULostEffect = resourceapi.DeviceTaintEffect(h.GPULostEffect)
	}
	d, err := draplugin.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer d.Stop()
	return o.serve(ctx, d)
}

// serve runs the plugin's endpoints beside it until ctx ends or the plugin
// stops, and waits for them to end.
func (o *options) serve(ctx context.Context, d *draplugin.Driver) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if o.metricsAddress != "" {
		if err := serveMetrics(ctx, &wg, o.metricsAddress, promhttp.HandlerFor(d.Registry(), promhttp.HandlerOpts{})); err != nil {
			return err
		}
	}
	if o.healthPort >= 0 {
		if err := d.ServeLiveness(ctx, &wg, o.healthAddress, o.healthPort); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		klog.FromContext(ctx).Info("Shutting down")
		return nil
	case <-d.Done():
		return d.Err()
	}
}

// The API rate limits. The prepare path's burst covers a node's largest
// burst of pods (64 one-GPU seats on an 8-GPU node with four seats a
// GPU) so that a burst of pods waits for no token; its QPS refills that
// in a few seconds. Work behind the calls keeps the conservative limits
// DRA drivers ship with: it only decides how soon statuses and events
// appear. docs/performance.md has the measurements and the fleet cost.
const (
	DefaultPrepareQPS      = 20
	DefaultPrepareBurst    = 64
	DefaultBackgroundQPS   = 5
	DefaultBackgroundBurst = 10
)

// kubeClients are the clients given, or those of --kubeconfig.
func (o *options) kubeClients() (client, background kubernetes.Interface, err error) {
	if o.clients != nil {
		return o.clients.Prepare, o.clients.Background, nil
	}
	if client, err = kubeClient(o.kubeconfig, o.kubeAPIQPS, o.kubeAPIBurst, "prepare"); err != nil {
		return nil, nil, err
	}
	if background, err = kubeClient(o.kubeconfig, o.backgroundQPS, o.backgroundBurst, "background"); err != nil {
		return nil, nil, err
	}
	return client, background, nil
}

// kubeClient is a client with its own rate limiter; purpose goes into its
// user agent, so that the API server's logs and metrics tell the two apart.
func kubeClient(kubeconfig string, qps float64, burst int, purpose string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig given and not running in a cluster: %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("read kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.QPS, cfg.Burst = float32(qps), burst
	cfg.UserAgent = name + "/" + purpose
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	return client, nil
}

// serveMetrics serves h on addr/metrics until ctx ends; wg tracks the
// server.
func serveMetrics(ctx context.Context, wg *sync.WaitGroup, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger := klog.FromContext(ctx)
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Metrics endpoint failed")
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		_ = srv.Close()
	})
	logger.Info("Serving metrics", "address", ln.Addr().String())
	return nil
}
