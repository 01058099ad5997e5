package placement

import (
	"time"

	"k8s.io/component-base/metrics"
)

// Steps of the score's work, as the metric labels them.
const (
	stepPreFilter = "PreFilter"
	// stepDeviceOrder is the order handed to the DynamicResources
	// plugin's allocator: work of ours inside that plugin's PreFilter.
	stepDeviceOrder = "DeviceOrder"
	stepPreScore    = "PreScore"
)

// Metrics is the score's own cost, every cycle. The framework's
// scheduler_plugin_execution_duration_seconds times plugins in a tenth
// of the cycles and drops observations while its buffer (1,000 a
// second) is full, which Filter and Score, one per node, fill on a
// cluster of a few hundred nodes: it cannot tell what the score costs
// there. Score itself (a map look-up per node) is not timed.
//
// Beside it, the cluster's fragmentation (fragmentation.go), measured
// when scraped.
type Metrics struct {
	duration      *metrics.HistogramVec
	fragmentation *fragmentationCollector
}

// NewMetrics returns the score's metrics, to register with the
// scheduler's registry (Collectors and StableCollectors) before the
// scheduler starts.
func NewMetrics() *Metrics {
	return &Metrics{fragmentation: newFragmentationCollector(), duration: metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem:      "kyb_placement",
		Name:           "duration_seconds",
		Help:           "Time the KybPlacement score spends per scheduling cycle in each step: PreFilter, DeviceOrder (within the DynamicResources plugin's PreFilter), PreScore.",
		Buckets:        metrics.ExponentialBuckets(0.00001, 2, 18),
		StabilityLevel: metrics.ALPHA,
	}, []string{"step"})}
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []metrics.Registerable {
	return []metrics.Registerable{m.duration}
}

// StableCollectors are the collectors to register (CustomMustRegister):
// the fragmentation, measured when scraped.
func (m *Metrics) StableCollectors() []metrics.StableCollector {
	return []metrics.StableCollector{m.fragmentation}
}

// since records the time since start under step; a nil Metrics records
// nothing.
func (m *Metrics) since(step string, start time.Time) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(step).Observe(time.Since(start).Seconds())
}
