// Package e2e proves the driver against the real Kubernetes components, all
// in this process: embedded etcd, kube-apiserver, kube-scheduler, the
// resource-claim controller, and per simulated node the kubelet's DRA
// manager and plugin manager talking to the driver's real plugin over unix
// sockets. Tests run one after another: the API server sets process-wide
// feature gates for a cluster's lifetime.
package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
)

// repoRoot is the repository's top directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// TestMain checks that the tests leave nothing behind: every cluster's
// directory (etcd data, sockets, CDI specs, checkpoints) is gone after its
// test, whatever happened in it.
func TestMain(m *testing.M) {
	before := leftovers()
	code := m.Run()
	for _, d := range leftovers() {
		if !slices.Contains(before, d) {
			fmt.Fprintf(os.Stderr, "FAIL: the tests left %s behind\n", d)
			code = 1
		}
	}
	os.Exit(code)
}

func leftovers() []string {
	var out []string
	for _, pattern := range []string{"kyb-cluster-*", "kubernetes-kube-apiserver*"} {
		m, _ := filepath.Glob(filepath.Join(os.TempDir(), pattern))
		out = append(out, m...)
	}
	return out
}
