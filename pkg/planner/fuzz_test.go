package planner_test

import (
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// Any configuration the decoder accepts is planned without a panic, and
// the plan keeps its invariants or is refused with a reason.
func FuzzPlan(f *testing.F) {
	for _, c := range configs {
		f.Add([]byte(c))
	}
	f.Add([]byte("grouping: explicit\ngroups: [{name: a, gpus: [7, 6]}, {name: b, gpus: [1]}]\nprofiles: [{resource: kyb.ai/gpu-2x-seat}, {resource: kyb.ai/gpu-1x-seat, allowOverprovision: true}]\n"))
	inv := presetInventory(f, "nvlink-2x4")
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, _, err := v1alpha1.LoadNodeConfig(data, "fuzz.yaml")
		if err != nil {
			return
		}
		plan, err := planner.New(inv, cfg)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("a rejection without a message")
			}
			return
		}
		checkPlanProperties(t, plan)
		layout, _ := plan.ExclusiveLayout()
		for _, a := range layout.Groups() {
			for _, b := range layout.Groups() {
				if a.Excludes(b) {
					t.Fatalf("exclusive layout keeps %s and %s", a.DeviceName(), b.DeviceName())
				}
			}
		}
	})
}
