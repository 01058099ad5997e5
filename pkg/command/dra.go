package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/deviceplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
)

const draUsage = `Usage: kyb-dra-plugin [flags]
       kyb-dra-plugin plan [flags]

Runs the kyb DRA kubelet plugin (driver gpu.kyb.ai) on this node: publishes
its GPU groups and seats as ResourceSlices and prepares the claims allocated
on them. Every flag can also be set by the environment variable named
beside it; a flag given on the command line wins.

  kyb-dra-plugin --node-name "$NODE_NAME"                    # on a GPU node
  kyb-dra-plugin --simulate dgx-h100 --kubeconfig ~/.kube/config --node-name node-1

'kyb-dra-plugin plan -h' describes the offline subcommand.

Flags:
`

// pluginFlags are the flags of the node plugin.
type pluginFlags struct {
	nodeSource
	healthFlags
	kubeconfig     string
	kubeAPIQPS     float64
	kubeAPIBurst   int
	cdiRoot        string
	registrarDir   string
	pluginsDir     string
	healthPort     int
	healthAddress  string
	metricsAddress string
	podUID         string
	layout         *oneOf
	driverFiles    *oneOf
	hostDriverRoot string
	bootIDFile     string

	// devicePluginDir is where a live device-plugin shim makes the plugin
	// refuse to start.
	devicePluginDir string
}

func (p *pluginFlags) register(f *flags) {
	p.nodeSource.register(f, "")
	p.healthFlags.register(f)
	f.StringVar(&p.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	f.bind("kubeconfig", "KUBECONFIG")
	f.Float64Var(&p.kubeAPIQPS, "kube-api-qps", 5, "queries per second to the API server")
	f.bind("kube-api-qps", "KUBE_API_QPS")
	f.IntVar(&p.kubeAPIBurst, "kube-api-burst", 10, "burst of queries to the API server")
	f.bind("kube-api-burst", "KUBE_API_BURST")
	f.StringVar(&p.cdiRoot, "cdi-root", "/var/run/cdi", "directory the container runtime reads CDI specs from")
	f.bind("cdi-root", "CDI_ROOT")
	f.StringVar(&p.registrarDir, "kubelet-registrar-directory-path", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration directory")
	f.bind("kubelet-registrar-directory-path", "KUBELET_REGISTRAR_DIRECTORY_PATH")
	f.StringVar(&p.pluginsDir, "kubelet-plugins-directory-path", "/var/lib/kubelet/plugins", "the kubelet's plugin directory; the plugin keeps its socket and checkpoint in <dir>/gpu.kyb.ai")
	f.bind("kubelet-plugins-directory-path", "KUBELET_PLUGINS_DIRECTORY_PATH")
	f.StringVar(&p.devicePluginDir, "device-plugin-directory-path", "/var/lib/kubelet/device-plugins/", "the kubelet's device-plugin directory; the plugin refuses to start while the kyb device-plugin shim answers there")
	f.bind("device-plugin-directory-path", "DEVICE_PLUGIN_DIRECTORY_PATH")
	f.IntVar(&p.healthPort, "healthcheck-port", -1, "port of the gRPC health service (liveness probe); -1: off")
	f.bind("healthcheck-port", "HEALTHCHECK_PORT")
	f.StringVar(&p.healthAddress, "healthcheck-address", "127.0.0.1", "IP address the gRPC health service listens on; the kubelet's gRPC probes dial the pod IP, so a chart sets it from status.podIP")
	f.bind("healthcheck-address", "HEALTHCHECK_ADDRESS")
	f.StringVar(&p.metricsAddress, "metrics-address", "", "address of the Prometheus metrics endpoint (/metrics), such as :8080; empty: off")
	f.bind("metrics-address", "METRICS_ADDRESS")
	f.StringVar(&p.podUID, "pod-uid", "", "UID of the plugin's pod; enables seamless rolling updates (kubelet 1.33 or newer)")
	f.bind("pod-uid", "POD_UID")
	p.layout = &oneOf{value: "auto", allowed: []string{"auto", "shared", "per-seat"}}
	f.Var(p.layout, "device-layout", "ResourceSlice layout: auto (shared groups, one device per seat where the API server lacks consumable capacity), shared or per-seat")
	f.bind("device-layout", "KYB_DEVICE_LAYOUT")
	p.driverFiles = &oneOf{value: "auto", allowed: []string{"auto", "nvidia-cdi", "driver-root", "none"}}
	f.Var(p.driverFiles, "driver-files", "how containers get the driver's libraries and tools: auto (NVIDIA's CDI spec if the node has one, else the files under --driver-root), nvidia-cdi, driver-root or none")
	f.bind("driver-files", "KYB_DRIVER_FILES")
	f.StringVar(&p.hostDriverRoot, "host-driver-root", "", "where --driver-root is on the host, when the plugin sees it elsewhere; default: the same path")
	f.bind("host-driver-root", "NVIDIA_HOST_DRIVER_ROOT")
	f.StringVar(&p.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding the node's boot ID")
	f.bind("boot-id-file", "KYB_BOOT_ID_FILE")
}

// DRAPlugin is the kyb-dra-plugin command: the node plugin, or `plan`.
func DRAPlugin(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "plan" {
		return Plan(ctx, args[1:], getenv, stdout, stderr)
	}
	f := newFlags("kyb-dra-plugin", stderr)
	var p pluginFlags
	p.register(f)
	return execute("kyb-dra-plugin", draUsage, f, args, getenv, p.check, func() error {
		if getenv("GOGC") == "" {
			debug.SetGCPercent(pluginGCPercent)
		}
		return runPlugin(ctx, &p)
	})
}

// pluginGCPercent is the plugin's GOGC where the environment sets none.
// Its live heap is a few MiB, so at Go's default of 100 the garbage kept
// between collections is as large as everything it holds: the footprint
// study (docs/performance.md) measured 3–4 MiB more resident memory after
// a thousand prepares, for a collection every ~1.5 MiB allocated at 50,
// a few dozen prepares.
const pluginGCPercent = 50

func (p *pluginFlags) check() error {
	if p.nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required: the name of the Kubernetes node the plugin serves")
	}
	if p.healthPort < -1 || p.healthPort > 65535 {
		return fmt.Errorf("--healthcheck-port %d is not a port (or -1 for off)", p.healthPort)
	}
	if net.ParseIP(p.healthAddress) == nil {
		return fmt.Errorf("--healthcheck-address %q is not an IP address", p.healthAddress)
	}
	if p.metricsAddress != "" {
		if _, _, err := net.SplitHostPort(p.metricsAddress); err != nil {
			return fmt.Errorf("--metrics-address %q: %w", p.metricsAddress, err)
		}
	}
	return p.healthFlags.check(&p.nodeSource)
}

func runPlugin(ctx context.Context, p *pluginFlags) error {
	// One node runs the DRA plugin or the device-plugin shim, never both.
	if err := deviceplugin.CheckNoLiveShim(p.devicePluginDir); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	client, err := kubeClient(p.kubeconfig, p.kubeAPIQPS, p.kubeAPIBurst)
	if err != nil {
		return err
	}
	node, err := p.load(ctx)
	if err != nil {
		return err
	}
	defer node.host.Close()
	logger.Info("Node", "gpus", node.inv.Summary(), "source", node.host.Description)
	for _, w := range node.plan.Warnings {
		logger.Info("Plan", "warning", w)
	}

	mon, stopHealth, err := startHealth(ctx, node, p.faultsFile)
	if err != nil {
		return err
	}
	defer stopHealth()

	opts := draplugin.Options{
		NodeName:      p.nodeName,
		Client:        client,
		Inventory:     node.inv,
		Plan:          node.plan,
		Edits:         containeredits.Options{DeviceNumbers: node.host.DeviceNumbers},
		CDIRoot:       p.cdiRoot,
		PluginDataDir: strings.TrimSuffix(p.pluginsDir, "/") + "/gpu.kyb.ai",
		RegistrarDir:  p.registrarDir,
		PodUID:        types.UID(p.podUID),
		BootIDFile:    p.bootIDFile,
		Layout:        draplugin.LayoutMode(p.layout.value),
		Health:        mon,
		Collectors:    []prometheus.Collector{mon.Collector()},
	}
	if h := node.config.Health; h != nil {
		opts.GPULostEffect = resourceapi.DeviceTaintEffect(h.GPULostEffect)
	}
	if err := p.chooseDriverFiles(ctx, node, &opts); err != nil {
		return err
	}
	d, err := draplugin.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer d.Stop()
	if p.metricsAddress != "" {
		if err := serveMetrics(ctx, p.metricsAddress, promhttp.HandlerFor(d.Registry(), promhttp.HandlerOpts{})); err != nil {
			return err
		}
	}
	if p.healthPort >= 0 {
		if err := d.ServeLiveness(ctx, p.healthAddress, p.healthPort); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		logger.Info("Shutting down")
		return nil
	case <-d.Done():
		return d.Err()
	}
}

func kubeClient(kubeconfig string, qps float64, burst int) (kubernetes.Interface, error) {
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
	cfg.UserAgent = "kyb-dra-plugin"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	return client, nil
}

func serveMetrics(ctx context.Context, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	klog.FromContext(ctx).Info("Serving metrics", "address", ln.Addr().String())
	return nil
}
