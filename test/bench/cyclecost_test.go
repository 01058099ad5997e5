package bench

import (
	"context"
	"math"
	"testing"
)

func TestParseCycleCosts(t *testing.T) {
	page := []byte(`# HELP kyb_placement_duration_seconds [ALPHA] Time the KybPlacement score spends per scheduling cycle in each step.
kyb_placement_duration_seconds_bucket{step="PreScore",le="1e-05"} 1
kyb_placement_duration_seconds_sum{step="PreScore"} 0.004
kyb_placement_duration_seconds_count{step="PreScore"} 8
kyb_placement_duration_seconds_sum{step="PreFilter"} 0.0005
kyb_placement_duration_seconds_count{step="PreFilter"} 10
kyb_placement_duration_seconds_sum{step="DeviceOrder"} 0.0015
kyb_placement_duration_seconds_count{step="DeviceOrder"} 10
scheduler_plugin_execution_duration_seconds_sum{extension_point="PreScore",plugin="KybPlacement",status="Success"} 9
scheduler_plugin_execution_duration_seconds_count{extension_point="PreScore",plugin="KybPlacement",status="Success"} 3
scheduler_scheduling_attempt_duration_seconds_sum{profile="kyb-scheduler",result="scheduled"} 3
scheduler_scheduling_attempt_duration_seconds_count{profile="kyb-scheduler",result="scheduled"} 8
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.001"} 2
scheduler_scheduling_algorithm_duration_seconds_sum 0.4
scheduler_scheduling_algorithm_duration_seconds_count 10
scheduler_plugin_evaluation_total{extension_point="Filter",plugin="DynamicResources",profile="kyb-scheduler"} 1200
scheduler_plugin_evaluation_total{extension_point="PreFilter",plugin="DynamicResources",profile="kyb-scheduler"} 10
scheduler_plugin_evaluation_total{extension_point="Filter",plugin="NodeAffinity",profile="kyb-scheduler"} 2500
`)
	c, err := parseCycleCosts(page)
	if err != nil {
		t.Fatal(err)
	}
	// Per cycle of the algorithm; the framework's sampled plugin metric
	// is not read.
	want := cycleCosts{attempt: 0.4 / 10, score: (0.004 + 0.0005 + 0.0015) / 10, scoreCycles: 8, draFilters: 1200}
	for _, f := range []struct {
		name      string
		got, want float64
	}{{"attempt", c.attempt, want.attempt}, {"score", c.score, want.score}, {"score cycles", c.scoreCycles, want.scoreCycles}, {"DRA Filter calls", c.draFilters, want.draFilters}} {
		if math.Abs(f.got-f.want) > 1e-12 {
			t.Errorf("%s per cycle %v, want %v", f.name, f.got, f.want)
		}
	}
	for step, want := range map[string]float64{"PreScore": 0.004 / 10, "PreFilter": 0.0005 / 10, "DeviceOrder": 0.0015 / 10} {
		if math.Abs(c.steps[step]-want) > 1e-12 {
			t.Errorf("%s per cycle %v, want %v", step, c.steps[step], want)
		}
	}
	if got := c.scoreShare(); math.Abs(got-want.score/want.attempt) > 1e-12 {
		t.Errorf("score share %v, want %v", got, want.score/want.attempt)
	}
	if _, err := parseCycleCosts([]byte("scheduler_scheduling_algorithm_duration_seconds_sum nope\n")); err == nil {
		t.Error("a malformed value was taken")
	}
}

func TestProcessCPUSeconds(t *testing.T) {
	page := func(text string) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { return []byte(text), nil }
	}
	got, err := processCPUSeconds(context.Background(), page("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"+
		"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\nprocess_open_fds 9\n"))
	if err != nil || got != 12.5 {
		t.Errorf("CPU seconds %v (%v), want 12.5", got, err)
	}
	if _, err := processCPUSeconds(context.Background(), page("process_open_fds 9\n")); err == nil {
		t.Error("a page without process_cpu_seconds_total gave a figure")
	}
}
