package draplugin_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// TestMIGDevicesOfAGPUWhoseInstancesCannotBeListedAreNotPublished: where
// the start cannot list GPU 0's instances (NVML fails every try), the
// plugin does not know which placements are free or which instance is a
// static seat, so it publishes none of GPU 0's MIG devices, says so in a
// Node event, and keeps publishing the GPUs' whole groups.
func TestMIGDevicesOfAGPUWhoseInstancesCannotBeListedAreNotPublished(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	e.partition(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1, true)
	e.stop()
	for n := 1; n <= 200; n++ {
		if err := e.sim.FailCall(simnode.CallFault{Call: simnode.CallGetGpuInstances, Nth: n, Ret: nvml.ERROR_UNKNOWN}); err != nil {
			t.Fatal(err)
		}
	}
	e.start()
	waitFor(t, "the slices to publish g1-1x", func() bool { return slices.Contains(publishedDevices(t, e), "g1-1x") })
	if pub := publishedDevices(t, e); countPrefix(pub, "g0-mig-") != 0 {
		t.Errorf("GPU 0's instances are unknown, yet its MIG devices are published: %v", pub)
	}
	if note := nodeEvent(t, e, migseats.ReasonForeignMIGInstance); !strings.Contains(note, "GPU 0 cannot be listed") {
		t.Errorf("Node event %s: %q, want one saying GPU 0's instances cannot be listed", migseats.ReasonForeignMIGInstance, note)
	}
}
