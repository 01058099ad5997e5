package draplugin_test

import (
	"testing"
)

func TestMetricsCountPreparesAndErrors(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	good := e.claim(class2x)
	e.prepareOK(good)
	bad := e.claim(class2x)
	bad.Status.Allocation.Devices.Results[0].Device = "g89-2x"
	bad = e.update(bad)
	e.prepare(bad)
	e.unprepare(good)

	value := e.metric
	if v := value("kyb_dra_prepared_claims_total", nil); v != 2 {
		t.Errorf("prepared claims %v, want 2 (one failed)", v)
	}
	if v := value("kyb_dra_errors_total", map[string]string{"operation": "prepare", "kind": "claim"}); v != 1 {
		t.Errorf("claim errors %v, want 1", v)
	}
	if v := value("kyb_dra_prepare_duration_seconds", nil); v != 2 {
		t.Errorf("prepare latency samples %v, want 2 calls", v)
	}
	if v := value("kyb_dra_unprepared_claims_total", nil); v != 1 {
		t.Errorf("unprepared %v, want 1", v)
	}
	if v := value("kyb_dra_published_devices", map[string]string{"profile": "1x", "layout": "shared"}); v != 8 {
		t.Errorf("published 1x devices %v, want 8", v)
	}
}

// metric reads one series of the driver's metrics: a counter's or gauge's
// value, a histogram's sample count. labels select the series.
func (e *env) metric(name string, labels map[string]string) float64 {
	e.t.Helper()
	families, err := e.driver.Registry().Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		e.t.Fatalf("metric %s has no series %v", name, labels)
	}
	e.t.Fatalf("metric %s missing", name)
	return 0
}
