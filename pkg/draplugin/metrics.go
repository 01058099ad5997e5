package draplugin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the plugin's Prometheus metrics. Each Driver has its own
// registry (no global state); the command serves it on --metrics-address.
type metrics struct {
	registry          *prometheus.Registry
	prepares          *prometheus.CounterVec
	unprepares        *prometheus.CounterVec
	prepareDuration   prometheus.Histogram
	unprepareDuration prometheus.Histogram
	errors            *prometheus.CounterVec
	published         *prometheus.GaugeVec
	hidden            prometheus.Gauge
	inflight          prometheus.Gauge
	statusesWritten   prometheus.Counter
}

func newMetrics() *metrics {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	m := &metrics{
		registry: prometheus.NewRegistry(),
		prepares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kyb_dra_prepared_claims_total", Help: "Claims passed to NodePrepareResources.",
		}, []string{}),
		unprepares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kyb_dra_unprepared_claims_total", Help: "Claims passed to NodeUnprepareResources.",
		}, []string{}),
		prepareDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kyb_dra_prepare_duration_seconds", Help: "Duration of NodePrepareResources calls.", Buckets: buckets,
		}),
		unprepareDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kyb_dra_unprepare_duration_seconds", Help: "Duration of NodeUnprepareResources calls.", Buckets: buckets,
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kyb_dra_errors_total", Help: "Errors by operation and kind (claim, checkpoint, cdi, status, mig, publish).",
		}, []string{"operation", "kind"}),
		published: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kyb_dra_published_devices", Help: "Devices published in the node's ResourceSlices, by profile and layout.",
		}, []string{"profile", "layout"}),
		hidden: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kyb_dra_blocked_devices_hidden", Help: "Devices left out of the ResourceSlices because they hold no seat and are blocked by an overlapping group in use (unavailableGroups: hideBlocked, opt-in; 0 by default).",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kyb_dra_prepare_inflight", Help: "NodePrepareResources calls in progress.",
		}),
		statusesWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kyb_dra_claim_statuses_written_total", Help: "Claim statuses written with the seats of their devices (a second after their prepare; failures count in kyb_dra_errors_total{kind=\"status\"}).",
		}),
	}
	m.registry.MustRegister(m.prepares, m.unprepares, m.prepareDuration, m.unprepareDuration, m.errors, m.published, m.hidden, m.inflight, m.statusesWritten)
	// The runtime's own figures (goroutines, heap, resident memory), which
	// operators watch for leaks.
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, op := range []string{"prepare", "unprepare"} {
		for _, kind := range []string{"claim", "checkpoint", "cdi", "status", "mig"} {
			m.errors.WithLabelValues(op, kind)
		}
	}
	m.errors.WithLabelValues("publish", "api")
	m.errors.WithLabelValues("publish", "invalid")
	return m
}

func (m *metrics) observePrepareStart() { m.inflight.Inc() }

func (m *metrics) observePrepare(d time.Duration, claims int) {
	m.inflight.Dec()
	m.prepareDuration.Observe(d.Seconds())
	m.prepares.WithLabelValues().Add(float64(claims))
}

func (m *metrics) observeUnprepare(d time.Duration, claims int) {
	m.unprepareDuration.Observe(d.Seconds())
	m.unprepares.WithLabelValues().Add(float64(claims))
}

func (m *metrics) prepareError(kind string)   { m.errors.WithLabelValues("prepare", kind).Inc() }
func (m *metrics) unprepareError(kind string) { m.errors.WithLabelValues("unprepare", kind).Inc() }
