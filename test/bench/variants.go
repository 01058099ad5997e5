package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// The allocator study measures our representation step by step, so that
// each change the product made because of it has its own figure. A step
// is our node as the plugin publishes it, or that with one change undone.

// Variant is one measured representation of our node.
type Variant struct {
	Shape
	// Note says what the step changes.
	Note string
	// Goals says whether the product's goals are judged on this row.
	Goals bool
}

// fullAttributes is a node config that publishes every attribute the
// driver knows, on config (which must not set attributes itself).
func fullAttributes(config string) string {
	names := make([]string, 0, len(v1alpha1.KnownAttributes))
	for _, a := range v1alpha1.KnownAttributes {
		names = append(names, fmt.Sprintf("%q", a))
	}
	return config + "\nattributes: [" + strings.Join(names, ", ") + "]\n"
}

// OneXOnlyConfig publishes only the 1x profile: a cluster whose only
// DeviceClass is gpu-1x-seat.
const OneXOnlyConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
`

// Variants are the representations measured, in the order the changes were
// made: every attribute, the lean default set, one-seat groups as ordinary
// devices (the product's default), consumable seats, and one profile only.
func Variants(ctx context.Context, preset string) ([]Variant, error) {
	type def struct {
		name, config, note string
		transform          func(Shape) Shape
		goals              bool
	}
	defs := []def{
		{"every attribute, every group shared", fullAttributes(""), "all 11 attributes; one-seat groups published as shared devices", sharedOneSeat, false},
		{"lean attributes, every group shared", "", "the default 4 attributes (attribute diet)", sharedOneSeat, false},
		{"lean, one-seat groups plain (default)", "", "one-seat groups as ordinary devices: skipped once allocated; every group published", nil, true},
		{"lean, plain, largest groups first", "", "device order reversed: 4x, 2x, then 1x groups", reverseDevices, false},
		{"lean, plain, blocked groups hidden (opt-in)", "", "groups that hold no seat and overlap a held group left out of the slice (unavailableGroups: hideBlocked)", hidingBlocked, false},
		{"consumable seats (demo config)", DemoConfig, "1x groups of 4 seats, 2x of 3 (shared devices); every group published", nil, true},
		{"demo config, blocked groups hidden (opt-in)", DemoConfig, "as above, with unavailableGroups: hideBlocked", hidingBlocked, false},
		{"1x profile only", OneXOnlyConfig, "only the profile a DeviceClass uses", nil, false},
	}
	var out []Variant
	for _, d := range defs {
		s, err := KybShape(ctx, d.name, preset, d.config, "1x")
		if err != nil {
			return nil, fmt.Errorf("step %q: %w", d.name, err)
		}
		if d.transform != nil {
			s = d.transform(s)
			s.Name = d.name
		}
		out = append(out, Variant{Shape: s, Note: d.note, Goals: d.goals})
	}
	return out, nil
}

// mapDevices is s with every slice's device list replaced by f's result.
func mapDevices(s Shape, f func([]resourceapi.Device) []resourceapi.Device) Shape {
	out := s
	apply := func(res resourceslice.DriverResources) resourceslice.DriverResources {
		for pn, pool := range res.Pools {
			for i := range pool.Slices {
				if len(pool.Slices[i].Devices) > 0 {
					pool.Slices[i].Devices = f(slices.Clone(pool.Slices[i].Devices))
				}
			}
			res.Pools[pn] = pool
		}
		return res
	}
	out.Resources = func(node string) resourceslice.DriverResources { return apply(s.Resources(node)) }
	if s.Republish != nil {
		out.Republish = func(node string, held draresources.Held) resourceslice.DriverResources {
			return apply(s.Republish(node, held))
		}
	}
	return out
}

// sharedOneSeat publishes one-seat groups as shared devices again, as the
// plugin did before: allowMultipleAllocations and a one-value policy.
func sharedOneSeat(s Shape) Shape {
	return mapDevices(s, func(ds []resourceapi.Device) []resourceapi.Device {
		for i := range ds {
			if ds[i].AllowMultipleAllocations != nil {
				continue
			}
			one := resource.NewQuantity(1, resource.DecimalSI)
			ds[i].AllowMultipleAllocations = ptr.To(true)
			ds[i].Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"seats": {
				Value: *one, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: one, ValidValues: []resource.Quantity{*one}},
			}}
		}
		return ds
	})
}

// hidingBlocked publishes s again after every allocation, without the
// groups that hold no seat and are blocked by a held group: the plugin's
// opt-in unavailableGroups: hideBlocked.
func hidingBlocked(s Shape) Shape {
	s.Republish = s.hide
	return s
}

func reverseDevices(s Shape) Shape {
	return mapDevices(s, func(ds []resourceapi.Device) []resourceapi.Device {
		slices.Reverse(ds)
		return ds
	})
}

// withoutDevices is s with the devices drop names left out of every
// slice, and no claim of its class fitting anywhere: what a full node of s
// would look like to an allocator that skipped those devices before any
// selector.
func withoutDevices(s Shape, name string, drop func(device string) bool) Shape {
	out := mapDevices(s, func(ds []resourceapi.Device) []resourceapi.Device {
		return slices.DeleteFunc(ds, func(d resourceapi.Device) bool { return drop(d.Name) })
	})
	out.Name = name
	out.PerNode = 0
	return out
}
