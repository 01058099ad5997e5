package app

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
)

// podGroupAPI is the API that gang scheduling watches.
const (
	podGroupAPI      = "scheduling.k8s.io/v1beta1"
	podGroupResource = "podgroups"
)

// gangAPITimeout bounds the check at start: an API server that does not
// answer in time is left to kube-scheduler's own start to report.
const gangAPITimeout = 10 * time.Second

// servesGangAPI says whether the API server serves the PodGroup API, or
// an error where it cannot say.
type servesGangAPI func(ctx context.Context) (bool, error)

// gangGateFollowsTheAPI turns gang scheduling off where the API server
// does not serve the PodGroup API and the command line did not ask for it.
// With GenericWorkload on, kube-scheduler waits for a PodGroup informer
// that never syncs there and never schedules a pod; Kubernetes 1.37 ships
// with that API off, so kyb-scheduler as it ships would not work on a
// cluster as Kubernetes ships.
func gangGateFollowsTheAPI(ctx context.Context, cmd *cobra.Command, serves servesGangAPI) error {
	logger := klog.FromContext(ctx)
	if !utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload) || gateSetOnCommandLine(cmd, string(features.GenericWorkload)) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, gangAPITimeout)
	defer cancel()
	ok, err := serves(ctx)
	if err != nil {
		logger.Info("Cannot tell whether the API server serves the PodGroup API; gang scheduling stays on", "api", podGroupAPI, "err", err)
		return nil
	}
	if ok {
		return nil
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.GenericWorkload): false}); err != nil {
		return fmt.Errorf("turn gang scheduling off: %w", err)
	}
	logger.Info("The API server does not serve the PodGroup API: gang scheduling is off. To place gangs, serve it (kube-apiserver --feature-gates=GenericWorkload=true --runtime-config=scheduling.k8s.io/v1beta1=true) and start kyb-scheduler again",
		"api", podGroupAPI, "resource", podGroupResource)
	return nil
}

// gateSetOnCommandLine says whether --feature-gates names gate.
func gateSetOnCommandLine(cmd *cobra.Command, gate string) bool {
	f := cmd.Flags().Lookup("feature-gates")
	if f == nil || !f.Changed {
		return false
	}
	for _, kv := range strings.Split(f.Value.String(), ",") {
		if name, _, _ := strings.Cut(strings.TrimSpace(kv), "="); name == gate {
			return true
		}
	}
	return false
}

// discoverGangAPI asks the API server the command connects to, by
// --master and --kubeconfig or in-cluster, as kube-scheduler connects
// unless its configuration file names another kubeconfig.
func discoverGangAPI(cmd *cobra.Command) servesGangAPI {
	return func(ctx context.Context) (bool, error) {
		var master, kubeconfig string
		if f := cmd.Flags().Lookup("master"); f != nil {
			master = f.Value.String()
		}
		if f := cmd.Flags().Lookup("kubeconfig"); f != nil {
			kubeconfig = f.Value.String()
		}
		cfg, err := clientcmd.BuildConfigFromFlags(master, kubeconfig)
		if err != nil {
			return false, fmt.Errorf("client configuration: %w", err)
		}
		cfg.Timeout = gangAPITimeout
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return false, fmt.Errorf("discovery client: %w", err)
		}
		list, err := dc.ServerResourcesForGroupVersion(podGroupAPI)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("discover %s: %w", podGroupAPI, err)
		}
		for _, r := range list.APIResources {
			if r.Name == podGroupResource {
				return true, nil
			}
		}
		return false, nil
	}
}
