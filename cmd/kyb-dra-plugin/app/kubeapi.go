package app

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
)

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

// apiFlags say how the plugin reaches the API server: its kubeconfig and
// the rate limits of its two clients.
type apiFlags struct {
	kubeconfig   string
	kubeAPIQPS   float64
	kubeAPIBurst int
	// The background client's limits: claim statuses, events, slices.
	backgroundQPS   float64
	backgroundBurst int
	// given, when set, are used instead of --kubeconfig's.
	given *Clients
}

func (a *apiFlags) addFlags(f *cli.FlagSet) {
	f.StringVar(&a.kubeconfig, "kubeconfig", "KUBECONFIG", "", "kubeconfig file; empty: in-cluster configuration")
	f.Float64Var(&a.kubeAPIQPS, "kube-api-qps", "KUBE_API_QPS", DefaultPrepareQPS, "queries per second to the API server on the prepare path (a claim GET per prepared claim)")
	f.IntVar(&a.kubeAPIBurst, "kube-api-burst", "KUBE_API_BURST", DefaultPrepareBurst, "burst of queries to the API server on the prepare path: claims a node prepares at once without waiting for the rate limiter")
	f.Float64Var(&a.backgroundQPS, "kube-api-background-qps", "KUBE_API_BACKGROUND_QPS", DefaultBackgroundQPS, "queries per second to the API server for work behind the calls: claim statuses, events, ResourceSlices")
	f.IntVar(&a.backgroundBurst, "kube-api-background-burst", "KUBE_API_BACKGROUND_BURST", DefaultBackgroundBurst, "burst of queries to the API server for work behind the calls")
}

// clients are the clients given, or those of --kubeconfig.
func (a *apiFlags) clients() (client, background kubernetes.Interface, err error) {
	if a.given != nil {
		return a.given.Prepare, a.given.Background, nil
	}
	if client, err = kubeClient(a.kubeconfig, a.kubeAPIQPS, a.kubeAPIBurst, "prepare"); err != nil {
		return nil, nil, err
	}
	if background, err = kubeClient(a.kubeconfig, a.backgroundQPS, a.backgroundBurst, "background"); err != nil {
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
