// Package e2e proves the driver against the real Kubernetes components, all
// in this process: embedded etcd, kube-apiserver, kube-scheduler, the
// resource-claim controller, and per simulated node the kubelet's DRA
// manager and plugin manager talking to the driver's real plugin over unix
// sockets. Tests run one after another: the API server sets process-wide
// feature gates for a cluster's lifetime.
package e2e

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// repoRoot is the repository's top directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func TestMain(m *testing.M) {
	os.Exit(m.Run())
}
