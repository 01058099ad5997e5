package placement

import (
	"testing"

	"k8s.io/component-base/metrics"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// Every cycle of a seat pod records each step of the score's work.
func TestEveryCycleRecordsTheScoresSteps(t *testing.T) {
	reg := metrics.NewKubeRegistry()
	m := NewMetrics()
	reg.MustRegister(m.Collectors()...)
	f := newFixture(t, Args{DefaultPolicy: Pack}, threeNodes()...)
	f.plugin.metrics = m
	const cycles = 3
	for range cycles {
		pod, claim := f.seatPod(class1x, 1)
		state := framework.NewCycleState()
		if _, st := f.scoresIn(state, pod, f.feasibleWith(f.cycleAllocator(state, pod), claim)); st != nil {
			t.Fatal(st)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, fam := range families {
		if fam.GetName() != "kyb_placement_duration_seconds" {
			continue
		}
		for _, s := range fam.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "step" {
					counts[l.GetValue()] = s.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	for _, step := range []string{stepPreFilter, stepDeviceOrder, stepPreScore} {
		if counts[step] != cycles {
			t.Errorf("step %s timed %d times in %d cycles (all: %v)", step, counts[step], cycles, counts)
		}
	}
}
