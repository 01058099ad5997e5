package app

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// checkShimDrained refuses to take the node over while the kubelet lists a
// container holding devices of the device-plugin shim: the shim gone, its
// pods keep their GPUs, which the plugin would hand out again, and its
// start destroy the MIG instances the shim made for their seats (no claim
// holds them). A container's devices are the shim's by their resource, or
// by their IDs whatever the resource (driver.ShimDevices): the plan's
// seats and MIG devices, and the seats the MIG journal in pluginDir names.
// pr nil: not asked.
func checkShimDrained(ctx context.Context, pr *podresources.Client, plan *planner.Plan, pluginDir string) error {
	logger := klog.FromContext(ctx)
	if pr == nil {
		logger.Info("Not checking that no pod of the device-plugin shim holds a GPU", "warning", "--pod-resources-socket is empty; drain the node before the plugin takes it over from the shim")
		return nil
	}
	l, err := podresources.ListWhenServed(ctx, podresources.StartWait, pr.List)
	if err != nil {
		return fmt.Errorf("ask the kubelet whether pods of the kyb device-plugin shim still hold this node's GPUs (--pod-resources-socket; empty: not asked): %w", err)
	}
	resources := make([]string, len(plan.Profiles))
	for i, prof := range plan.Profiles {
		resources[i] = prof.Resource
	}
	// A journal that cannot be read is settled at start, where an
	// instance no record names is left as one the plugin did not make.
	records, _, err := miginstance.ReadJournal(pluginDir)
	if err != nil {
		logger.Info("The shim's MIG seats are told by their resources and the plan's device names alone", "reason", err.Error())
	}
	claims := make([]string, len(records))
	for i, r := range records {
		claims[i] = string(r.Claim)
	}
	return driver.CheckNoShimPods(l.Holders(driver.ShimDevices(resources, plan.ShimDeviceIDs(), claims)))
}
