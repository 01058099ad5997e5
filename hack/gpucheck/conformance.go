//go:build gpucheck

package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/nvmlconformance"
)

// conformance runs the NVML conformance suite (pkg/nvmlconformance) on
// this node's NVML: the facts the plugin relies on, which the unit tests
// assert of every simulated node, asserted of the driver itself.
func (c *check) conformance(ctx context.Context) (outcome, error) {
	h := c.node.Host
	r := nvmlconformance.Run(ctx, nvmlconformance.Target{NVML: h.NVML, PCIe: h.PCIe, Kernel: h})
	o := outcome{summary: "the checks of every simulated node's unit tests: " + r.Summary(),
		hardware: fmt.Sprintf("every NVML call of the suite, to the driver of %d GPUs; the kernel's /proc/devices, the NVIDIA device nodes, mig-minors and capability files", len(c.node.Inv.GPUs))}
	for _, x := range r {
		o.details = append(o.details, x.String())
	}
	if failed := r.Failed(); len(failed) > 0 {
		var names []string
		for _, f := range failed {
			names = append(names, strings.Fields(f.String())[1])
		}
		return o, fmt.Errorf("%d checks fail (%s): the plugin relies on what this driver does not answer, or the simulated node answers otherwise", len(failed), strings.Join(names, ", "))
	}
	return o, nil
}
