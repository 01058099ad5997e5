package app

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// checkShimDrained refuses to take the node over while the kubelet lists a
// container holding devices of the device-plugin shim's resources: the
// shim gone, its pods keep their GPUs, which the plugin would hand out
// again, and its start destroy the MIG instances the shim made for their
// seats (no claim holds them). pr nil: not asked.
func checkShimDrained(ctx context.Context, pr *podresources.Client, plan *planner.Plan) error {
	if pr == nil {
		klog.FromContext(ctx).Info("Not checking that no pod of the device-plugin shim holds a GPU", "warning", "--pod-resources-socket is empty; drain the node before the plugin takes it over from the shim")
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
	return driver.CheckNoShimPods(l.ResourceHolders(driver.ShimResource(resources)))
}
