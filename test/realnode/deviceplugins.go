package realnode

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// SeatResources are the extended resources the shim serves.
var SeatResources = []v1.ResourceName{"kyb.ai/gpu-1x-seat", "kyb.ai/gpu-2x-seat", "kyb.ai/gpu-4x-seat"}

// claimDevicePluginDir makes sure no other kubelet listens in the
// kubelet's fixed device-plugin directory, and removes what the node's
// kubelet and shim leave there when the node goes.
func (n *Node) claimDevicePluginDir(tb ktesting.TB) {
	tb.Helper()
	sock := filepath.Join(KubeletDevicePluginDir, "kubelet.sock")
	if conn, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		_ = conn.Close()
		tb.Fatalf("a kubelet already listens on %s: a real node needs the machine's device-plugin directory to itself", sock)
	}
	// The kubelet makes its fixed directories; the node takes away those
	// that were not there before it.
	var made []string
	for d := KubeletDevicePluginDir; d != "/var/lib"; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err != nil {
			made = append(made, d)
		}
	}
	tb.Cleanup(func() {
		for _, f := range devicePluginFiles() {
			_ = os.Remove(f)
		}
		for _, d := range made {
			_ = os.Remove(d)
		}
	})
}

// devicePluginFiles are the files nodes make in the kubelet's
// device-plugin directory: the kubelet's socket and checkpoint, the
// shim's sockets.
func devicePluginFiles() []string {
	out, _ := filepath.Glob(filepath.Join(KubeletDevicePluginDir, "kyb-*.sock"))
	for _, f := range []string{"kubelet.sock", "kubelet_internal_checkpoint"} {
		if _, err := os.Lstat(filepath.Join(KubeletDevicePluginDir, f)); err == nil {
			out = append(out, filepath.Join(KubeletDevicePluginDir, f))
		}
	}
	return out
}

// WaitForResources waits until the node offers seats of each of
// resources (of any seat resource, when none is named): the shim
// registered them with the kubelet, and the kubelet reported them.
func (n *Node) WaitForResources(tb ktesting.TB, resources ...v1.ResourceName) {
	tb.Helper()
	waitFor(tb, fmt.Sprintf("seat resources %v of node %s", resources, n.Name), n.plugin, 60*time.Second, func() bool {
		node, err := n.c.Client.CoreV1().Nodes().Get(n.c.Ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		offers := func(r v1.ResourceName) bool {
			q, ok := node.Status.Allocatable[r]
			return ok && !q.IsZero()
		}
		if len(resources) == 0 {
			return slices.ContainsFunc(SeatResources, offers)
		}
		for _, r := range resources {
			if !offers(r) {
				return false
			}
		}
		return true
	})
}

// Resources returns the node's allocatable seat resources, "name=count".
func (n *Node) Resources(tb ktesting.TB) string {
	tb.Helper()
	node, err := n.c.Client.CoreV1().Nodes().Get(n.c.Ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, r := range SeatResources {
		q := node.Status.Allocatable[r]
		out = append(out, string(r)+"="+q.String())
	}
	return strings.Join(out, " ")
}

// ShimRegistrations counts the shim's registrations with the kubelet so
// far, over all its starts: each resource registers once per start of the
// shim and once per start of the kubelet.
func (n *Node) ShimRegistrations() int {
	return strings.Count(n.PluginLog(), `"Sent the seats to the kubelet"`)
}

// WaitForRegistrations waits until the shim has registered count more
// resources than after, and the kubelet has their seats: the node's
// allocatable lags (it is reported every few seconds), the kubelet's
// device manager does not.
func (n *Node) WaitForRegistrations(tb ktesting.TB, after, count int) {
	tb.Helper()
	waitFor(tb, fmt.Sprintf("%d registrations of the shim with the kubelet", count), n.plugin, 60*time.Second, func() bool {
		return n.ShimRegistrations() >= after+count
	})
}
