//go:build gpucheck

package main

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// The conformance step fails when a check fails, naming the checks, and
// its report holds every result: here a GPU whose NVLink query fails as
// no driver's may, which the plugin's discovery would not survive.
func TestTheConformanceStepFailsWithTheChecks(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	sim, inv := simnodetest.Inventory(t, "dgx-h100", "node-1")
	dev, ret := sim.NVML().DeviceGetHandleByIndex(2)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	dev.(*mock.Device).GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	c := &check{node: &nodesetup.Node{Host: &gpuhost.Host{NVML: sim.NVML(), PCIe: sim.PCIe(), Simulated: sim}, Inv: inv}}
	o, err := c.conformance(ctx)
	want := "2 checks fail (discovery, links): the plugin relies on what this driver does not answer, or the simulated node answers otherwise"
	if got := errString(err); got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	details := strings.Join(o.details, "\n")
	for _, line := range []string{
		"fail  links           node    GPU 2: GetNvLinkState(0): Unknown Error, which fails discovery",
		"pass  mig-geometry    GPU 7   MIG mode off",
	} {
		if !strings.Contains(details, line) {
			t.Errorf("the step's details lack %q:\n%s", line, details)
		}
	}
	if !strings.HasPrefix(o.hardware, "every NVML call of the suite, to the driver of 8 GPUs") {
		t.Errorf("hardware %q", o.hardware)
	}
	if o.summary != "the checks of every simulated node's unit tests: 43 passed, 8 skipped, 2 failed" {
		t.Errorf("summary %q", o.summary)
	}
}
