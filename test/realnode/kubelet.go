package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// kubeletConfig is the kubelet's configuration for one node. The API
// server reaches the kubelet (logs, exec) with no client certificate, so
// the kubelet lets anonymous requests through: a test node only. Pods go
// under the node's own cgroup root, so that two nodes on one machine and
// the tests after them do not meet. Eviction is off: the test machine's
// disk and memory are not the node's to guard. The kubelet makes no
// iptables chains (its hint for an iptables kube-proxy, its martian packet
// guard): they would outlive the node, and the node's kube-proxy uses
// nftables.
func kubeletConfig(n *Node, port int) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: %[1]q
containerRuntimeEndpoint: unix://%[2]s
imageServiceEndpoint: unix://%[2]s
podLogsDir: %[3]q
port: %[4]d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "0%%", nodefs.available: "0%%", imagefs.available: "0%%", nodefs.inodesFree: "0%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
shutdownGracePeriod: 0s
makeIPTablesUtilChains: false
`, n.cgroupRoot, n.ContainerdSocket, filepath.Join(n.Dir, "pod-logs"), port)
}

// startKubelet starts the node's kubelet (once more after a stop, on the
// same directories) and waits until the node is Ready.
func (n *Node) startKubelet(tb ktesting.TB) {
	tb.Helper()
	if n.kubeletPort == 0 {
		port, err := harness.FreePort()
		if err != nil {
			tb.Fatal(err)
		}
		n.kubeletPort = port
		if err := os.WriteFile(filepath.Join(n.Dir, "kubelet.yaml"), []byte(kubeletConfig(n, port)), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	p, err := startProcess("kubelet", filepath.Join(n.Dir, "kubelet.log"), nil, filepath.Join(n.tools.Dir, "kubelet"),
		"--config", filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig", n.c.Kubeconfig,
		"--root-dir", n.RootDir,
		// Its serving certificate, which it would put in /var/lib/kubelet.
		"--cert-dir", filepath.Join(n.Dir, "pki"),
		"--hostname-override", n.Name,
		"--v", "2",
	)
	if err != nil {
		tb.Fatal(err)
	}
	n.kubelet = p
	n.waitReady(tb)
}

// StopKubelet stops the kubelet; its pods keep running, as on a real node.
func (n *Node) StopKubelet() {
	n.kubelet.stop(10 * time.Second)
}

// RestartKubelet stops the kubelet and starts it again on the same state.
func (n *Node) RestartKubelet(tb ktesting.TB) {
	tb.Helper()
	n.StopKubelet()
	n.startKubelet(tb)
}

// waitReady waits until the node reports Ready after the kubelet's start.
func (n *Node) waitReady(tb ktesting.TB) {
	tb.Helper()
	started := metav1.NewTime(time.Now().Truncate(time.Second))
	waitFor(tb, "node "+n.Name+" Ready", n.kubelet, 90*time.Second, func() bool {
		node, err := n.c.Client.CoreV1().Nodes().Get(n.c.Ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == v1.NodeReady {
				return cond.Status == v1.ConditionTrue && !cond.LastHeartbeatTime.Before(&started)
			}
		}
		return false
	})
	n.untaintReady(tb)
}

// untaintReady removes the not-ready taint the kubelet registers its node
// with, as the node lifecycle controller does once the node is Ready (the
// in-process control plane runs no controller manager).
func (n *Node) untaintReady(tb ktesting.TB) {
	tb.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.c.Client.CoreV1().Nodes().Get(n.c.Ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		kept := node.Spec.Taints[:0]
		for _, t := range node.Spec.Taints {
			if t.Key != v1.TaintNodeNotReady && t.Key != v1.TaintNodeUnreachable {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(node.Spec.Taints) {
			return nil
		}
		node.Spec.Taints = kept
		_, err = n.c.Client.CoreV1().Nodes().Update(n.c.Ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		tb.Fatalf("untaint node %s: %v", n.Name, err)
	}
}
