package harness

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// CreateDeviceClasses creates the DeviceClasses of the profiles a node
// configuration gives a simulated node (preset), each mapping its
// extended resource, as `kyb-dra-plugin plan -o deviceclasses` prints
// them; a class that exists already (deployments/static holds those of
// the default profiles) is left as it is. A MIG profile's class is in no
// static file: its name follows the configuration.
func (c *Cluster) CreateDeviceClasses(ctx context.Context, preset, config string) error {
	sim, err := simnode.Load(preset, "classes")
	if err != nil {
		return err
	}
	inv, err := inventory.Discover(ctx, sim.NVML(), sim.PCIe())
	if err != nil {
		return fmt.Errorf("discover the GPUs of %s: %w", preset, err)
	}
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(config), "config")
	if err != nil {
		return err
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		return fmt.Errorf("plan %s: %w", preset, err)
	}
	for _, dc := range draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{ExtendedResources: true}) {
		_, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create DeviceClass %s: %w", dc.Name, err)
		}
	}
	return nil
}
