package realnode

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/compatibility"
	"k8s.io/component-base/configz"
	"k8s.io/klog/v2"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// controllers are the controllers of kube-controller-manager that
// ControllerManager runs: what installing, upgrading and uninstalling a
// chart of DaemonSets (and Deployments) needs.
//
//   - daemonset, deployment, replicaset: the workloads and their rollouts.
//   - garbage-collector: objects owned by a deleted one go with it
//     (a DaemonSet's pods and ControllerRevisions on uninstall).
//   - serviceaccount: the "default" ServiceAccount of every namespace,
//     which the ServiceAccount admission plugin requires of pods that
//     name none.
//   - root-ca-certificate-publisher: the kube-root-ca.crt ConfigMap of
//     every namespace, the CA of a pod's projected token volume.
//   - namespace: deleting a namespace deletes what is in it.
//
// Not the serviceaccount-token controller: it writes legacy token Secrets,
// while the kubelet gets a pod's token through the TokenRequest API,
// which the API server serves itself. Not the resource-claim controller:
// harness.Start runs it for every cluster.
var controllers = []string{
	"daemonset-controller",
	"deployment-controller",
	"replicaset-controller",
	"garbage-collector-controller",
	"serviceaccount-controller",
	"root-ca-certificate-publisher-controller",
	"namespace-controller",
}

// ControllerManager runs kube-controller-manager in this process, as its
// command does (cmd/kube-controller-manager/app), with the controllers
// above, no leader election and no serving port, for a cluster started
// with harness.Options{ControllerManager: realnode.ControllerManager}. It
// returns once the default namespace has its ServiceAccount (pods can be
// created from then on), with the function that stops it. Pods trust the
// cluster's RootCA for the API server. It lives here rather than in the
// harness so that only the tests that need it link it.
func ControllerManager(tb ktesting.TB, c *harness.Cluster) func() {
	tb.Helper()
	started := time.Now()
	s, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		tb.Fatalf("kube-controller-manager options: %v", err)
	}
	// A registry of its own, as the upstream test server does: the
	// process-wide one would keep its flags' effects after the cluster.
	gates := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	version := utilcompatibility.DefaultKubeEffectiveVersionForTest()
	version.SetEmulationVersion(gates.EmulationVersion())
	version.SetMinCompatibilityVersion(gates.MinCompatibilityVersion())
	registry := compatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(compatibility.DefaultKubeComponent, version, gates); err != nil {
		tb.Fatalf("kube-controller-manager feature gates: %v", err)
	}
	s.ComponentGlobalsRegistry = registry

	all, disabled, aliases := kcm.KnownControllers(), kcm.ControllersDisabledByDefault(), kcm.ControllerAliases()
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	named := s.Flags(all, disabled, aliases)
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
	}
	if c.RootCA != "" {
		args = append(args, "--root-ca-file="+c.RootCA)
	}
	if err := fs.Parse(args); err != nil {
		tb.Fatalf("kube-controller-manager flags: %v", err)
	}
	s.ParsedFlags = &named
	if err := registry.Set(); err != nil {
		tb.Fatalf("kube-controller-manager feature gates: %v", err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(c.Ctx, klog.LoggerWithName(klog.FromContext(c.Ctx), "kube-controller-manager")))
	config, err := s.Config(ctx, all, disabled, aliases)
	if err != nil {
		cancel()
		tb.Fatalf("kube-controller-manager config: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- kcm.Run(ctx, config.Complete()) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Logf("kube-controller-manager stopped: %v", err)
			}
			configz.Delete(kcm.ConfigzName)
		})
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			done <- err
			return false, fmt.Errorf("kube-controller-manager ended: %w", err)
		default:
		}
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		stop()
		tb.Fatalf("kube-controller-manager: no ServiceAccount default/default after a minute: %v", err)
	}
	tb.Logf("kube-controller-manager up in %v: %s", time.Since(started).Round(time.Millisecond), strings.Join(controllers, ", "))
	return stop
}
