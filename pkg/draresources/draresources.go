// Package draresources turns a plan into the DRA API objects the driver
// publishes: the ResourceSlices of the node's pool and the DeviceClasses of
// its profiles. It is pure; the plugin publishes what it returns and
// `kyb-dra-plugin plan -o resourceslices` prints it.
//
// The shared layout (the default) publishes one device per group with
// allowMultipleAllocations and a consumable capacity "seats"; each group
// consumes one counter per GPU from the node's counter set, unless its
// profile overprovisions. The allocator charges counters on a shared
// device's first seat only, so overlapping groups exclude each other while
// one is in use, and later seats of the same group only consume "seats".
// A sized profile's device adds "memory" and "compute", which its claims
// ask in the sizes they need (sized.go).
//
// MIG profiles add one device per instance they may take and counters per
// memory slice (mig.go).
//
// The per-seat layout is the fallback for API servers that drop those
// fields (consumable capacity or partitionable devices switched off): one
// ordinary device per seat, on the plan's exclusive layout, in which no two
// published groups that must exclude each other overlap. It has no MIG
// seats: without counters nothing keeps overlapping instances apart.
package draresources

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

const (
	// CounterSet is the name of the node's counter set: one counter per GPU.
	CounterSet = "gpus"
	// SeatsCapacity is the capacity a seat consumes. It is the only
	// capacity of a profile that is not sized (sized.go adds memory and
	// compute): on a shared device every capacity is consumable, and one
	// without a request policy would be taken whole by the first seat.
	SeatsCapacity resourceapi.QualifiedName = "seats"
	// MaxDevicesPerSlice is the API limit for slices with counters or
	// taints.
	MaxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
)

// Layout is how groups and seats become devices.
type Layout string

const (
	// LayoutShared publishes one shared device per group.
	LayoutShared Layout = "shared"
	// LayoutPerSeat publishes one device per seat, on the exclusive layout.
	LayoutPerSeat Layout = "per-seat"
)

// CounterName is the counter of GPU i.
func CounterName(i int) string { return "gpu" + strconv.Itoa(i) }

// Resources returns the node's pool as the resourceslice controller takes
// it, in the given layout. Slice and device order is the plan's
// scheduling order: the allocator is first-fit over it.
func Resources(plan *planner.Plan, inv *inventory.Inventory, pool string, layout Layout) resourceslice.DriverResources {
	var slices []resourceslice.Slice
	switch layout {
	case LayoutPerSeat:
		exclusive, _ := plan.ExclusiveLayout()
		var devices []resourceapi.Device
		for _, g := range exclusive.Ordered() {
			for s := 0; s < g.Seats(); s++ {
				d := baseDevice(g, inv, plan.Attributes)
				d.Name = g.SeatID(s)
				devices = append(devices, d)
			}
		}
		// Without counters the API allows 128 devices per slice, but only
		// 64 once one has a taint: cutting at 64 always keeps the slices
		// the same whether or not a GPU is unhealthy.
		slices = chunk(devices, MaxDevicesPerSlice)
	default:
		var devices []resourceapi.Device
		mc := newMIGCounters(plan)
		usesCounters := mc != nil
		for _, g := range plan.Ordered() {
			d := sharedDevice(g, inv, plan.Attributes, mc)
			usesCounters = usesCounters || len(d.ConsumesCounters) > 0
			devices = append(devices, d)
		}
		for _, d := range plan.MIGDevices() {
			devices = append(devices, mc.migDevice(d, inv, plan.Attributes))
		}
		if usesCounters {
			counters := map[string]resourceapi.Counter{}
			for i := range inv.GPUs {
				counters[CounterName(i)] = counter(mc.gpuWeight(i))
			}
			slices = append(slices, mc.counterSlices(resourceapi.CounterSet{Name: CounterSet, Counters: counters})...)
		}
		slices = append(slices, chunk(devices, MaxDevicesPerSlice)...)
	}
	if len(slices) == 0 {
		// An empty pool says "running, no devices", unlike no pool at all.
		slices = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{pool: {Slices: slices}}}
}

func chunk(devices []resourceapi.Device, max int) []resourceslice.Slice {
	var out []resourceslice.Slice
	for len(devices) > 0 {
		n := min(max, len(devices))
		out = append(out, resourceslice.Slice{Devices: devices[:n:n]})
		devices = devices[n:]
	}
	return out
}

func sharedDevice(g *planner.Group, inv *inventory.Inventory, attrs []v1alpha1.AttributeName, mc *migCounters) resourceapi.Device {
	d := baseDevice(g, inv, attrs)
	seats := resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(g.Seats()), resource.DecimalSI)}
	// A group of one seat is an ordinary device. Once allocated, the
	// scheduler's allocator skips it before evaluating any selector, while
	// it evaluates the class's CEL on a shared device however full it is:
	// on a busy node this halves the cost of every Filter call
	// (docs/performance.md). Its "seats" capacity stays, so that a claim
	// asking for one seat explicitly still fits.
	if g.Seats() > 1 {
		d.AllowMultipleAllocations = ptr.To(true)
		seats.RequestPolicy = seatsPolicy()
	}
	d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{SeatsCapacity: seats}
	if sizes, sized := g.Sizes(); sized {
		d.Capacity = sizedCapacities(sizes)
	}
	if !g.Profile.AllowOverprovision {
		counters := map[string]resourceapi.Counter{}
		// On a GPU with MIG profiles, the GPU's whole: all its memory
		// slices (mig.go).
		for _, x := range g.GPUs {
			counters[CounterName(x)] = counter(mc.gpuWeight(x))
		}
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: CounterSet, Counters: counters}}
	}
	return d
}

// seatsPolicy lets a share take one seat by default and any whole number
// of seats up to the group's (groups of two seats or more).
func seatsPolicy() *resourceapi.CapacityRequestPolicy {
	one := resource.NewQuantity(1, resource.DecimalSI)
	return &resourceapi.CapacityRequestPolicy{
		Default:    one,
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: one, Step: resource.NewQuantity(1, resource.DecimalSI)},
	}
}

func baseDevice(g *planner.Group, inv *inventory.Inventory, attrs []v1alpha1.AttributeName) resourceapi.Device {
	return resourceapi.Device{Name: g.DeviceName(), Attributes: Attributes(g, inv, attrs)}
}

// Attributes are the attributes attrs of a group's device, as its slice
// publishes them (and as the device metadata gives them to containers).
func Attributes(g *planner.Group, inv *inventory.Inventory, attrs []v1alpha1.AttributeName) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	out := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for _, a := range attrs {
		if v, ok := attribute(a, g, inv); ok {
			out[resourceapi.QualifiedName(a)] = v
		}
	}
	return out
}

// attribute computes one attribute of a group; false where the group has
// no single value (GPUs of different models, no shared NUMA node).
func attribute(a v1alpha1.AttributeName, g *planner.Group, inv *inventory.Inventory) (resourceapi.DeviceAttribute, bool) {
	str := func(s string) (resourceapi.DeviceAttribute, bool) {
		return resourceapi.DeviceAttribute{StringValue: &s}, s != ""
	}
	common := func(get func(inventory.GPU) string) string {
		v := get(inv.GPUs[g.GPUs[0]])
		for _, x := range g.GPUs[1:] {
			if get(inv.GPUs[x]) != v {
				return ""
			}
		}
		return v
	}
	switch a {
	case v1alpha1.AttrProfile:
		return str(g.Profile.Name)
	case v1alpha1.AttrGroup:
		return str(g.Name)
	case v1alpha1.AttrGPUCount:
		return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(len(g.GPUs)))}, true
	case v1alpha1.AttrGPUIndices:
		return str(g.GPUList())
	case v1alpha1.AttrInterconnect:
		return str(g.Interconnect.String())
	case v1alpha1.AttrProductName:
		return str(common(func(x inventory.GPU) string { return x.ProductName }))
	case v1alpha1.AttrArchitecture:
		return str(common(func(x inventory.GPU) string { return x.Architecture }))
	case v1alpha1.AttrCUDAComputeCapability:
		v := Semver(common(func(x inventory.GPU) string { return x.CUDAComputeCapability }))
		return resourceapi.DeviceAttribute{VersionValue: &v}, v != ""
	case v1alpha1.AttrDriverVersion:
		v := Semver(inv.DriverVersion)
		return resourceapi.DeviceAttribute{VersionValue: &v}, v != ""
	case v1alpha1.AttrMemoryMiB:
		m := inv.GPUs[g.GPUs[0]].MemoryMiB
		for _, x := range g.GPUs[1:] {
			m = min(m, inv.GPUs[x].MemoryMiB)
		}
		return resourceapi.DeviceAttribute{IntValue: &m}, true
	case v1alpha1.AttrPCIeRoot:
		return str(g.PCIeRoot)
	case v1alpha1.AttrNUMANode:
		if g.NUMANode < 0 {
			return resourceapi.DeviceAttribute{}, false
		}
		return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}, true
	}
	return resourceapi.DeviceAttribute{}, false
}

// Semver turns "580.95.05" or "9.0" into a semantic version ("580.95.5",
// "9.0.0"), as version attributes require; "" when it is not one.
func Semver(v string) string {
	parts := strings.Split(v, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return ""
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return ""
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, ".")
}

// DeviceRef is what a published device name stands for.
type DeviceRef struct {
	Group *planner.Group
	// Seat is the fixed seat of a per-seat device, -1 for a shared one.
	// A MIG device's seat is its placement's position among its
	// profile's placements: overlapping placements are other seats, and
	// what keeps them apart on the node is NVML, which refuses them.
	Seat int
	// MIG is the instance a MIG device stands for; its Group is its GPU
	// as a group of one.
	MIG *planner.MIGDevice
}

// Index maps every device name of both layouts to its group (and seat), so
// that claims allocated before a layout switch still resolve, and every
// MIG device to its GPU and instance.
func Index(plan *planner.Plan) map[string]DeviceRef {
	idx := map[string]DeviceRef{}
	for _, d := range plan.MIGDevices() {
		idx[d.DeviceName()] = DeviceRef{Group: d.GPU.Group, Seat: slices.Index(d.GPU.Profile.Placements, d.Placement), MIG: &d}
	}
	for _, g := range plan.Groups() {
		idx[g.DeviceName()] = DeviceRef{Group: g, Seat: -1}
	}
	exclusive, _ := plan.ExclusiveLayout()
	for _, g := range exclusive.Groups() {
		orig := plan.GroupByDevice(g.DeviceName())
		for s := 0; s < g.Seats(); s++ {
			idx[g.SeatID(s)] = DeviceRef{Group: orig, Seat: s}
		}
	}
	return idx
}

// DeviceClassName is the class of a profile: the resource's name and
// domain swapped into a DNS subdomain (kyb.ai/gpu-2x-seat -> gpu-2x-seat.kyb.ai).
func DeviceClassName(resourceName string) string {
	domain, name, ok := strings.Cut(resourceName, "/")
	if !ok {
		return resourceName
	}
	return name + "." + domain
}

// DeviceClassOptions shape the DeviceClasses.
type DeviceClassOptions struct {
	// ExtendedResources maps each class to its profile's extended resource
	// name, so pods asking for kyb.ai/gpu-1x-seat are served by DRA.
	ExtendedResources bool
	// Labels are put on every class.
	Labels map[string]string
}

// DeviceClasses returns one class per profile, selecting the driver's
// devices of that profile.
func DeviceClasses(profiles []*planner.Profile, opts DeviceClassOptions) []*resourceapi.DeviceClass {
	var out []*resourceapi.DeviceClass
	for _, p := range profiles {
		dc := &resourceapi.DeviceClass{}
		dc.APIVersion = resourceapi.SchemeGroupVersion.String()
		dc.Kind = "DeviceClass"
		dc.Name = DeviceClassName(p.Resource)
		dc.Labels = opts.Labels
		dc.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: driver.ProfileSelector(p.Name)}}}
		if opts.ExtendedResources {
			dc.Spec.ExtendedResourceName = ptr.To(p.Resource)
		}
		out = append(out, dc)
	}
	return out
}

// ResourceSlices renders the pool as the ResourceSlice objects the
// resourceslice controller would create for node nodeName (names are
// generated by the API server from generateName).
func ResourceSlices(res resourceslice.DriverResources, nodeName string) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for poolName, pool := range res.Pools {
		for i, s := range pool.Slices {
			rs := &resourceapi.ResourceSlice{}
			rs.APIVersion = resourceapi.SchemeGroupVersion.String()
			rs.Kind = "ResourceSlice"
			rs.GenerateName = fmt.Sprintf("%05x-%s-%s-", i, driver.Name, nodeName)
			rs.Spec = resourceapi.ResourceSliceSpec{
				Driver:         driver.Name,
				Pool:           resourceapi.ResourcePool{Name: poolName, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName:       ptr.To(nodeName),
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			}
			out = append(out, rs)
		}
	}
	return out
}
