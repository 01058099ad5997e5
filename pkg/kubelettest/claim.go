package kubelettest

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// API is a fake API server holding node, on which the plugin's
// ResourceSlices, created with generateName, get a name (the fake's
// tracker gives none).
func API(node string) *fake.Clientset {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: types.UID(node + "-uid")}})
	var n atomic.Int64
	client.PrependReactor("create", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		slice := action.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice)
		if slice.Name == "" && slice.GenerateName != "" {
			slice.Name = fmt.Sprintf("%s%d", slice.GenerateName, n.Add(1))
		}
		return false, nil, nil
	})
	return client
}

// AllocatedClaim is a claim named name (UID uid, namespace default) for
// one seat of group, allocated on node as the scheduler allocates it: by
// the scheduler's own allocator over the devices the plugin publishes
// there, in the shared layout.
func AllocatedClaim(ctx context.Context, plan *planner.Plan, inv *inventory.Inventory, node string, group *planner.Group, name string, uid types.UID) (*resourceapi.ResourceClaim, error) {
	cluster := schedulertest.New(schedulertest.SchedulerFeatures())
	cluster.AddNode(node, draresources.Resources(plan, inv, node, draresources.LayoutShared), driver.Name)
	cluster.AddClasses(draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{})...)
	var mutate []func(*resourceapi.DeviceRequest)
	if slices.Contains(plan.Attributes, v1alpha1.AttrGroup) {
		mutate = append(mutate, schedulertest.WithSelector(fmt.Sprintf(`device.attributes[%q].group == %q`, driver.Name, group.Name)))
	}
	c := schedulertest.Claim(name, draresources.DeviceClassName(group.Profile.Resource), 1, mutate...)
	c.UID = uid
	alloc, err := cluster.Allocate(ctx, c, node)
	if err != nil {
		return nil, fmt.Errorf("allocate a seat of %s on %s: %w", group.Name, node, err)
	}
	if alloc == nil {
		return nil, fmt.Errorf("allocate a seat of %s on %s: it does not fit", group.Name, node)
	}
	for _, r := range alloc.Devices.Results {
		if r.Device != group.DeviceName() {
			return nil, fmt.Errorf("allocate a seat of %s on %s: the allocator chose %s", group.Name, node, r.Device)
		}
	}
	c.Status.Allocation = alloc
	return c, nil
}
