package driver

import (
	"fmt"
	"strings"
	"testing"
)

// Each surface's drain check names the containers holding the other's
// devices, at most ten of them, and says to drain; none passes.
func TestCheckNoPodsOfTheOtherSurface(t *testing.T) {
	if err := CheckNoShimPods(nil); err != nil {
		t.Errorf("CheckNoShimPods of no holder: %v", err)
	}
	if err := CheckNoDRAPods(nil); err != nil {
		t.Errorf("CheckNoDRAPods of no holder: %v", err)
	}
	var holders []string
	for i := range 12 {
		holders = append(holders, fmt.Sprintf("team-a/p%d container app: kyb.ai/gpu-1x-seat g%d-1x-seat-0", i, i))
	}
	err := CheckNoShimPods(holders)
	if err == nil || !strings.Contains(err.Error(), "pods still hold GPUs the kyb device-plugin shim handed out (team-a/p0 container app: kyb.ai/gpu-1x-seat g0-1x-seat-0; ") ||
		!strings.Contains(err.Error(), "team-a/p9 container app") || strings.Contains(err.Error(), "team-a/p10") || !strings.Contains(err.Error(), "; and 2 more)") ||
		!strings.Contains(err.Error(), "drain the node") {
		t.Errorf("CheckNoShimPods: %v", err)
	}
	err = CheckNoDRAPods([]string{"team-b/q container app: claim team-b/gpus"})
	if err == nil || !strings.Contains(err.Error(), "pods still hold GPUs the kyb DRA plugin prepared (team-b/q container app: claim team-b/gpus): the shim would hand the same GPUs out again; drain the node") {
		t.Errorf("CheckNoDRAPods: %v", err)
	}
}

// The shim's resources are those in the driver's domain and those the
// configuration names, whatever their domain.
func TestShimResource(t *testing.T) {
	shim := ShimResource([]string{"example.com/gpu-seat"})
	for r, want := range map[string]bool{
		"kyb.ai/gpu-1x-seat": true, "kyb.ai/mig-1g.10gb": true, "example.com/gpu-seat": true,
		"nvidia.com/gpu": false, "example.com/other": false, "kyb.ai": false, "gpu.kyb.ai/x": false,
	} {
		if got := shim(r); got != want {
			t.Errorf("ShimResource(%q) = %v, want %v", r, got, want)
		}
	}
}

// A container's device-plugin devices are the shim's by their resource,
// or, whatever the resource, by an ID that names one of the plan's seats
// or MIG devices or that a MIG journal record of the shim's names.
func TestShimDevices(t *testing.T) {
	shim := ShimDevices([]string{"example.com/gpu-seat"}, []string{"g0-1x-seat-0", "g0-mig-1g-10gb-6"},
		[]string{"device-plugin/g1-mig-1g-10gb-2", "8f9e0c4a-claim-uid"})
	for _, tt := range []struct {
		resource string
		ids      []string
		want     bool
	}{
		{"kyb.ai/gpu-1x-seat", []string{"g7-1x-seat-0"}, true},
		{"example.com/gpu-seat", []string{"anything"}, true},
		{"nvidia.com/mig-1g.10gb", []string{"g0-mig-1g-10gb-6"}, true},
		{"nvidia.com/gpu", []string{"GPU-a", "g0-1x-seat-0"}, true},
		{"nvidia.com/mig-1g.10gb", []string{"g1-mig-1g-10gb-2"}, true},
		{"nvidia.com/gpu", []string{"GPU-a"}, false},
		{"nvidia.com/mig-1g.10gb", []string{"8f9e0c4a-claim-uid"}, false},
		{"example.com/other", []string{"g1-mig-1g-10gb-3"}, false},
	} {
		if got := shim(tt.resource, tt.ids); got != tt.want {
			t.Errorf("ShimDevices(%q, %q) = %v, want %v", tt.resource, tt.ids, got, tt.want)
		}
	}
}
