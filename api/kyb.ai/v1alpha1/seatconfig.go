package v1alpha1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// SeatConfigKind is the kind of the opaque configuration a ResourceClaim or
// DeviceClass passes to the driver:
//
//	config:
//	- opaque:
//	    driver: gpu.kyb.ai
//	    parameters:
//	      apiVersion: kyb.ai/v1alpha1
//	      kind: SeatConfig
//	      visibleDevices: index
const SeatConfigKind = "SeatConfig"

// SeatConfig tunes what a container holding a seat sees.
type SeatConfig struct {
	metav1.TypeMeta `json:",inline"`

	// VisibleDevices says how CUDA_VISIBLE_DEVICES and
	// NVIDIA_VISIBLE_DEVICES name the group's GPUs: "uuid" (default) names
	// them by UUID, which stays right however the runtime numbers the
	// devices inside the container; "index" numbers them 0..n-1 in PCI
	// order (and sets CUDA_DEVICE_ORDER=PCI_BUS_ID), for software that
	// cannot parse UUIDs.
	VisibleDevices VisibleDevices `json:"visibleDevices,omitempty"`
}

// VisibleDevices says how the visible-devices variables name GPUs.
type VisibleDevices string

const (
	VisibleDevicesUUID  VisibleDevices = "uuid"
	VisibleDevicesIndex VisibleDevices = "index"
)

// Validate checks a seat configuration.
func (c *SeatConfig) Validate() error {
	var errs FieldErrors
	switch c.VisibleDevices {
	case "", VisibleDevicesUUID, VisibleDevicesIndex:
	default:
		errs.Add(field.NewPath("visibleDevices"), "must be %q or %q, not %q", VisibleDevicesUUID, VisibleDevicesIndex, c.VisibleDevices)
	}
	return errs.Err()
}

// SetDefaults fills the defaults.
func (c *SeatConfig) SetDefaults() {
	if c.VisibleDevices == "" {
		c.VisibleDevices = VisibleDevicesUUID
	}
}

// DecodeSeatConfig decodes the raw parameters of an opaque configuration
// meant for this driver. apiVersion and kind are required, since they are
// how a configuration says what it is.
func DecodeSeatConfig(raw []byte) (*SeatConfig, error) {
	cfg := &SeatConfig{}
	src, errs, err := decodeStrict(raw, "opaque parameters", cfg)
	if err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return nil, src.Annotate(errs)
	}
	if cfg.APIVersion != APIVersion || cfg.Kind != SeatConfigKind {
		return nil, fmt.Errorf("opaque parameters: apiVersion %q, kind %q is not a configuration this driver knows; use apiVersion %s, kind %s", cfg.APIVersion, cfg.Kind, APIVersion, SeatConfigKind)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("opaque parameters: %w", err)
	}
	cfg.SetDefaults()
	return cfg, nil
}
