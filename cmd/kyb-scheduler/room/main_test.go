package room

import (
	"os"
	"testing"

	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

func TestMain(m *testing.M) {
	// The framework records into kube-scheduler's metrics, which a
	// scheduler registers at its start.
	metrics.Register()
	os.Exit(m.Run())
}
