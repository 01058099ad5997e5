package draplugin

import (
	"context"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// SeatStatus is what the driver writes into a claim's
// status.devices[].data: the seats a device holds, for operators.
type SeatStatus struct {
	Profile     string   `json:"profile"`
	Group       string   `json:"group"`
	GPUs        []int    `json:"gpus"`
	GPUUUIDs    []string `json:"gpuUUIDs"`
	Seats       []int    `json:"seats"`
	Generations []int64  `json:"generations"`
}

// writeStatus records the seats in the claim's status with server-side
// apply, as field manager gpu.kyb.ai: the driver owns its own entries of
// status.devices and nothing else (RBAC: resourceclaims/driver,
// associated-node:patch).
func (d *Driver) writeStatus(ctx context.Context, claim *resourceapi.ResourceClaim, c *checkpoint.Claim) error {
	status := resourceapply.ResourceClaimStatus()
	for _, dev := range c.Devices {
		data, err := json.Marshal(SeatStatus{Profile: dev.Profile, Group: dev.Group, GPUs: dev.GPUs, GPUUUIDs: dev.GPUUUIDs, Seats: dev.Seats, Generations: dev.Generations})
		if err != nil {
			return fmt.Errorf("encode seat status: %w", err)
		}
		entry := resourceapply.AllocatedDeviceStatus().
			WithDriver(draresources.DriverName).WithPool(dev.Pool).WithDevice(dev.Device).
			WithData(runtime.RawExtension{Raw: data})
		if dev.ShareID != "" {
			entry = entry.WithShareID(dev.ShareID)
		}
		status = status.WithDevices(entry)
	}
	apply := resourceapply.ResourceClaim(claim.Name, claim.Namespace).WithStatus(status)
	_, err := d.client.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, apply, metav1.ApplyOptions{FieldManager: draresources.DriverName, Force: true})
	if err != nil {
		return fmt.Errorf("apply status of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return nil
}
