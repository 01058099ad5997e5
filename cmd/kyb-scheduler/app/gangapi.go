package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"sigs.k8s.io/yaml"
)

// podGroupAPI is the API that gang scheduling watches.
const (
	podGroupAPI      = "scheduling.k8s.io/v1beta1"
	podGroupResource = "podgroups"
)

// gangAPITimeout bounds the check at start; gangAPIRetry is the pause
// between its tries while the API server cannot answer (it may be
// starting). An API server that cannot say in time fails the start, as an
// API server kube-scheduler cannot reach would, rather than leave a
// scheduler that waits forever or drops gangs unasked.
const (
	gangAPITimeout = 30 * time.Second
	gangAPIRetry   = time.Second
)

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
	var ok bool
	var last error
	err := wait.PollUntilContextCancel(ctx, gangAPIRetry, true, func(ctx context.Context) (bool, error) {
		ok, last = serves(ctx)
		if last != nil {
			logger.V(2).Info("Cannot tell yet whether the API server serves the PodGroup API", "api", podGroupAPI, "err", last)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("cannot tell within %v whether the API server serves %s %s, which gang scheduling watches (name the gate to skip this check: --feature-gates=GenericWorkload=true or =false): %w",
			gangAPITimeout, podGroupAPI, podGroupResource, errors.Join(err, last))
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
	// The value prints as the flag was given, each gate possibly behind
	// its component ("kube:GenericWorkload=true", ":GenericWorkload=true").
	for _, kv := range strings.Split(f.Value.String(), ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(kv), "=")
		if i := strings.LastIndex(name, ":"); i >= 0 {
			name = name[i+1:]
		}
		if strings.TrimSpace(name) == gate {
			return true
		}
	}
	return false
}

// offline says whether the command only prints and exits (--version,
// --write-config-to): it needs no API server, so nothing is asked.
func offline(cmd *cobra.Command) bool {
	if f := cmd.Flags().Lookup("version"); f != nil && f.Changed && f.Value.String() != "false" {
		return true
	}
	if f := cmd.Flags().Lookup("write-config-to"); f != nil && f.Value.String() != "" {
		return true
	}
	return false
}

// discoverGangAPI asks the API server the command connects to, found as
// kube-scheduler finds it: --master, and the kubeconfig of the --config
// file's clientConnection where a file is given (--kubeconfig is then
// ignored), else --kubeconfig, else in-cluster.
func discoverGangAPI(cmd *cobra.Command) servesGangAPI {
	return func(ctx context.Context) (bool, error) {
		master, kubeconfig := flagValue(cmd, "master"), flagValue(cmd, "kubeconfig")
		if file := flagValue(cmd, "config"); file != "" {
			var err error
			if kubeconfig, err = configKubeconfig(file); err != nil {
				return false, err
			}
		}
		cfg, err := clientcmd.BuildConfigFromFlags(master, kubeconfig)
		if err != nil {
			return false, fmt.Errorf("client configuration: %w", err)
		}
		cfg.Timeout = 5 * time.Second
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

func flagValue(cmd *cobra.Command, name string) string {
	if f := cmd.Flags().Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// configKubeconfig is the kubeconfig a kube-scheduler configuration file
// names in clientConnection (empty: in-cluster).
func configKubeconfig(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read --config: %w", err)
	}
	var c struct {
		ClientConnection struct {
			Kubeconfig string `json:"kubeconfig"`
		} `json:"clientConnection"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	return c.ClientConnection.Kubeconfig, nil
}
