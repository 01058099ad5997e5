package bench

import (
	"context"
	"fmt"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// DemoConfig is the node configuration the shapes are measured with: the
// product demo's (1x with 4 seats, 2x with 3, 4x with 1; groups G01 and G23
// named), so that "our shape" has consumable seats and counters.
const DemoConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
- {resource: kyb.ai/gpu-4x-seat}
groups: [{name: G01, gpus: [0, 1]}, {name: G23, gpus: [2, 3]}]
`

// Shape is what one node publishes, and the class a one-device claim asks
// for.
type Shape struct {
	Name string
	// Driver is the driver name of the slices.
	Driver string
	// Resources returns the node's pool, named after the node.
	Resources func(node string) resourceslice.DriverResources
	// Classes are the DeviceClasses of the cluster.
	Classes []*resourceapi.DeviceClass
	// Class is the class of the measured claims (one device each).
	Class string
	// PerNode is how many such claims one node holds (hand-checked by the
	// study before it measures).
	PerNode int
	// Probe shapes the request of the claims measured against full nodes
	// and placed by first fit (a sized seat's size); the claims that fill
	// a node ask nothing beyond their class.
	Probe []func(*resourceapi.DeviceRequest)
	// Republish, when set, is what the node publishes while the seats
	// held are in use: the plugin's unavailableGroups: hideBlocked. The
	// study publishes it after every allocation on the node.
	Republish func(node string, held draresources.Held) resourceslice.DriverResources
	// hide is what the plugin publishes with unavailableGroups:
	// hideBlocked, for hidingBlocked to turn on.
	hide func(node string, held draresources.Held) resourceslice.DriverResources
}

// BasicDriver is the driver of upstream's scheduler_perf DRA workloads.
const BasicDriver = "test-driver.cdi.k8s.io"

// BasicShape approximates upstream scheduler_perf's
// resourceslice-basic-devices template: one slice per node with ten plain
// devices, each with thirteen attributes (strings, a version, a bool) and
// two capacities, and one class that selects on the driver alone.
func BasicShape() Shape {
	class := &resourceapi.DeviceClass{}
	class.Name = "test-class"
	class.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + BasicDriver + `"`}}}
	return Shape{
		Name:    "basic (upstream scheduler_perf)",
		Driver:  BasicDriver,
		Classes: []*resourceapi.DeviceClass{class},
		Class:   class.Name,
		PerNode: 10,
		Resources: func(node string) resourceslice.DriverResources {
			var devices []resourceapi.Device
			for i := 0; i < 10; i++ {
				devices = append(devices, basicDevice(i))
			}
			return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{{Devices: devices}}}}}
		},
	}
}

func basicDevice(i int) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	root := strconv.Itoa(i % 2)
	bus := fmt.Sprintf("0000:0%d:00.0", i)
	return resourceapi.Device{
		Name: fmt.Sprintf("basic-device-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"driver":                          str("xe"),
			"driverVersion":                   {VersionValue: ptr.To("1.2.3")},
			"resource.k8s.io/pciRoot":         str(root),
			"family":                          str("Arc Pro B-Series"),
			"health":                          str("Healthy"),
			"model":                           str("B60"),
			"pciAddress":                      str(bus),
			"pciId":                           str("0xe211"),
			"pciRoot":                         str("0" + root),
			"resource.kubernetes.io/pciBusID": str(bus),
			"resource.kubernetes.io/pciRoot":  str("pci0000:0" + root),
			"sriov":                           {BoolValue: ptr.To(true)},
			"type":                            str("gpu"),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory":     {Value: resource.MustParse("24480Mi")},
			"millicores": {Value: resource.MustParse("1k")},
		},
	}
}

// KybShape is what the plugin publishes for a simulated node of preset
// with the node configuration config (YAML; "" for the defaults), and the
// class of the claims: the given profile's.
func KybShape(ctx context.Context, name, preset, config, profile string) (Shape, error) {
	plan, inv, _, err := Plan(ctx, preset, "node-0", config)
	if err != nil {
		return Shape{}, err
	}
	prof := plan.Profile(profile)
	if prof == nil {
		return Shape{}, fmt.Errorf("shape %s: no profile %s", name, profile)
	}
	classes := draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{})
	return Shape{
		Name:    name,
		Driver:  driver.Name,
		Classes: classes,
		Class:   draresources.DeviceClassName(prof.Resource),
		PerNode: prof.Seats(),
		Resources: func(node string) resourceslice.DriverResources {
			return draresources.Resources(plan, inv, node, draresources.LayoutShared)
		},
		hide: func(node string, held draresources.Held) resourceslice.DriverResources {
			res := draresources.Resources(plan, inv, node, draresources.LayoutShared)
			draresources.HideBlocked(res, plan, held)
			return res
		},
	}, nil
}

// Plan plans a simulated node of preset named node (its GPU UUIDs derive
// from the name) with config (YAML, "" for none).
func Plan(ctx context.Context, preset, node, config string) (*planner.Plan, *inventory.Inventory, *simnode.Node, error) {
	sim, err := simnode.Load(preset, node)
	if err != nil {
		return nil, nil, nil, err
	}
	inv, err := inventory.Discover(ctx, sim.NVML(), sim.PCIe())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("discover simulated %s: %w", preset, err)
	}
	var cfg *v1alpha1.NodeConfig
	if config != "" {
		if cfg, _, err = v1alpha1.LoadNodeConfig([]byte(config), "bench config"); err != nil {
			return nil, nil, nil, err
		}
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("plan simulated %s: %w", preset, err)
	}
	return plan, inv, sim, nil
}
