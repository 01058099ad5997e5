package deviceplugin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// The kubelet's integer resources cannot tie a sized seat's memory and
// compute to its group, so the shim serves no sized profile: it registers
// and listens for the others only, and says at start why not.
func TestSizedProfilesAreNotServedOverRealSockets(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", `
profiles:
- {resource: kyb.ai/gpu-1x-sized, seatsPerGroup: 4, gpus: [0, 1, 2, 3], sharing: {strategy: mps, sized: true}}
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, gpus: [4, 5, 6, 7]}
`)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	e.ctx = klog.NewContext(e.ctx, logger)
	e.start()

	if got := e.plugin.Resources(); !slices.Equal(got, []string{"kyb.ai/gpu-1x-seat"}) {
		t.Errorf("served %v, want kyb.ai/gpu-1x-seat alone", got)
	}
	if got := e.kubelet.registered(); !slices.Equal(got, []string{"kyb.ai/gpu-1x-seat"}) {
		t.Errorf("registered %v, want kyb.ai/gpu-1x-seat alone", got)
	}
	if got := ids(e.kubelet.listsOf("kyb.ai/gpu-1x-seat")[0]); got != "g4-1x-seat-0 g4-1x-seat-1 g5-1x-seat-0 g5-1x-seat-1 g6-1x-seat-0 g6-1x-seat-1 g7-1x-seat-0 g7-1x-seat-1" {
		t.Errorf("kyb.ai/gpu-1x-seat lists %s", got)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "kyb-gpu-1x-sized.sock")); !os.IsNotExist(err) {
		t.Errorf("a socket for the sized profile: %v", err)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, want := range []string{
		`Not serving a sized profile resource="kyb.ai/gpu-1x-sized" profile="1x-sized" why="a sized seat's memory and compute must be on its own group, and the kubelet's integer resources are counted per node and allocated one resource at a time`,
		"serve sized profiles with the DRA plugin",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("the start's log lacks %q:\n%s", want, logs)
		}
	}
}

// A node whose profiles are all sized has nothing to serve, and the shim
// refuses to start saying why.
func TestANodeOfSizedProfilesOnlyIsRefusedSayingWhy(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", `
profiles:
- {resource: kyb.ai/gpu-1x-sized, seatsPerGroup: 4, sharing: {strategy: mps, sized: true}}
`)
	e.kubelet.start()
	_, err := e.tryStart()
	if err == nil || !strings.Contains(err.Error(), "sized profile(s) 1x-sized are not served through the device-plugin API") {
		t.Errorf("start: %v", err)
	}
}
