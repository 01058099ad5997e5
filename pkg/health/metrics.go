package health

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Event kinds counted by kyb_gpu_health_events_total, beside the fault
// kinds (xid, ecc, unreachable, lost).
const (
	// kindIgnoredXID is an XID event that the policy ignores.
	kindIgnoredXID = "xid_ignored"
	// kindRecovered is an unhealthy GPU becoming healthy again.
	kindRecovered = "recovered"
)

// metrics are the monitor's Prometheus metrics. The monitor owns them and
// the plugin that serves metrics registers them in its own registry: no
// global registry.
type metrics struct {
	events *prometheus.CounterVec
}

func newMetrics(gpus int) *metrics {
	m := &metrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kyb_gpu_health_events_total",
		Help: "GPU health events by GPU index and kind: xid (critical XID, or one with a recovery action pending), xid_ignored, ecc (double-bit), unreachable (failed NVML probe), lost, recovery_action (the driver asks for one, no XID seen), recovered.",
	}, []string{"gpu", "kind"})}
	// Zero series for every GPU, so that rate() and alerts see a series
	// before the first fault.
	for i := 0; i < gpus; i++ {
		for _, k := range []string{string(KindXID), kindIgnoredXID, string(KindECC), string(KindUnreachable), string(KindLost), string(KindRecoveryAction), kindRecovered} {
			m.events.WithLabelValues(strconv.Itoa(i), k)
		}
	}
	return m
}

func (m *metrics) count(gpu int, kind string) {
	m.events.WithLabelValues(strconv.Itoa(gpu), kind).Inc()
}
