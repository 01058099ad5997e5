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
	// Every kind is a series from the start, at 0 until it counts, so
	// that a rate() over it has a baseline (MIG's included).
	for _, op := range []string{"prepare", "unprepare"} {
		if v, ok := e.gathered("kyb_dra_errors_total", map[string]string{"operation": op, "kind": "mig"}); !ok || v != 0 {
			t.Errorf("kyb_dra_errors_total{operation=%q,kind=\"mig\"}: %v (present %t), want a series at 0", op, v, ok)
		}
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
	v, ok := e.gathered(name, labels)
	if !ok {
		e.t.Fatalf("metric %s has no series %v", name, labels)
	}
	return v
}

// gathered reads one series as metric does, reporting whether it exists.
func (e *env) gathered(name string, labels map[string]string) (float64, bool) {
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
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// kyb_seats tells, per group, how many seats are held, free, blocked by a
// group in use that shares a GPU, or unhealthy; they sum to the group's
// size.
func TestSeatMetrics(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	pair := e.claim(class2x) // G01, seat 0 of 3
	e.prepareOK(pair)
	seats := func(group, state string) float64 {
		return e.metric("kyb_seats", map[string]string{"group": group, "state": state})
	}
	for _, tt := range []struct {
		group                          string
		held, free, blocked, unhealthy float64
	}{
		{"G01", 1, 2, 0, 0},
		{"G0", 0, 0, 4, 0}, // shares GPU 0 with the pair in use
		{"G1", 0, 0, 4, 0},
		{"G2", 0, 4, 0, 0},
		{"G23", 0, 3, 0, 0},
	} {
		got := []float64{seats(tt.group, "held"), seats(tt.group, "free"), seats(tt.group, "blocked"), seats(tt.group, "unhealthy")}
		want := []float64{tt.held, tt.free, tt.blocked, tt.unhealthy}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("kyb_seats of %s (held, free, blocked, unhealthy) = %v, want %v", tt.group, got, want)
				break
			}
		}
	}
	if r := e.unprepare(pair)[string(pair.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if v := seats("G0", "free"); v != 4 {
		t.Errorf("G0 free after the pair is released: %v, want 4", v)
	}
}
