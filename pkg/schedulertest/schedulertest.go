// Package schedulertest runs the Kubernetes scheduler's own DRA allocator
// (k8s.io/dynamic-resource-allocation/structured, with the feature set
// kube-scheduler 1.37 enables by default) over the driver's published
// objects, for tests and studies only: tests use it to prove that the
// scheduler places what the driver publishes; the benchmarks and the
// placement study (test/) use it to measure. No binary links it
// (hack/deps-check.sh). It is not under an internal/ directory because
// the test/ module, a module of its own, uses it too.
package schedulertest

import (
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
)

// SchedulerFeatures are the allocator features kube-scheduler 1.37 turns
// on by default (the "incubating" allocator).
func SchedulerFeatures() structured.Features {
	return structured.Features{
		AdminAccess:             true,
		PrioritizedList:         true,
		PartitionableDevices:    true,
		DeviceTaints:            true,
		DeviceBindingAndStatus:  true,
		ConsumableCapacity:      true,
		FractionalCapacityRange: true,
	}
}

// Cluster is a set of nodes' ResourceSlices, DeviceClasses and the
// allocations made so far.
type Cluster struct {
	Features structured.Features
	slices   []*resourceapi.ResourceSlice
	classes  map[string]*resourceapi.DeviceClass
	nodes    map[string]*v1.Node
	state    structured.AllocatedState
	cel      *cel.Cache
}

// New returns an empty cluster allocating with features.
func New(features structured.Features) *Cluster {
	return &Cluster{
		Features: features,
		classes:  map[string]*resourceapi.DeviceClass{},
		nodes:    map[string]*v1.Node{},
		state: structured.AllocatedState{
			AllocatedDevices:         sets.New[structured.DeviceID](),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		},
		cel: cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity}),
	}
}

// AddNode adds a node and the slices of its pools.
func (c *Cluster) AddNode(node string, res resourceslice.DriverResources, driver string) {
	c.nodes[node] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"kubernetes.io/hostname": node}}}
	poolNames := make([]string, 0, len(res.Pools))
	for p := range res.Pools {
		poolNames = append(poolNames, p)
	}
	slices.Sort(poolNames)
	for _, pool := range poolNames {
		p := res.Pools[pool]
		for i, s := range p.Slices {
			rs := &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%05x-%s-%s-x", i, driver, node)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:         driver,
					Pool:           resourceapi.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: int64(len(p.Slices))},
					NodeName:       &node,
					Devices:        s.Devices,
					SharedCounters: s.SharedCounters,
				},
			}
			c.slices = append(c.slices, rs)
		}
	}
}

// SetNode replaces the slices node's pools have of driver with res, as a
// driver publishing again does.
func (c *Cluster) SetNode(node string, res resourceslice.DriverResources, driver string) {
	c.slices = slices.DeleteFunc(c.slices, func(s *resourceapi.ResourceSlice) bool {
		return s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == node
	})
	c.AddNode(node, res, driver)
}

// AddSlices adds slices as they are: a pool in any state a driver, or a
// node broken into, can leave it in (generations, counts, sizes).
func (c *Cluster) AddSlices(ss ...*resourceapi.ResourceSlice) {
	c.slices = append(c.slices, ss...)
}

// AddClasses adds DeviceClasses.
func (c *Cluster) AddClasses(classes ...*resourceapi.DeviceClass) {
	for _, dc := range classes {
		c.classes[dc.Name] = dc
	}
}

// Node returns a node added with AddNode, nil for any other name.
func (c *Cluster) Node(name string) *v1.Node { return c.nodes[name] }

// Slices returns every slice of the cluster.
func (c *Cluster) Slices() []*resourceapi.ResourceSlice { return c.slices }

// Allocator returns a fresh allocator over the current state, as the
// scheduler builds one per pod in PreFilter.
func (c *Cluster) Allocator(ctx context.Context) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, c.Features, c.state, classLister(c.classes), c.slices, c.cel)
}

// AllocatorOrdered is Allocator over the slices order makes of the
// cluster's, given the state: as kyb-scheduler's DynamicResources plugin
// builds its allocator where a plugin left it a device order.
func (c *Cluster) AllocatorOrdered(ctx context.Context, order func(*structured.AllocatedState, []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, c.Features, c.state, classLister(c.classes), order(&c.state, c.slices), c.cel)
}

// Allocate tries to allocate claim on node. It returns nil when the claim
// does not fit there; a fitting allocation is recorded in the state.
func (c *Cluster) Allocate(ctx context.Context, claim *resourceapi.ResourceClaim, node string) (*resourceapi.AllocationResult, error) {
	a, err := c.Allocator(ctx)
	if err != nil {
		return nil, err
	}
	return c.AllocateWith(ctx, a, claim, node)
}

// Try is AllocateWith without recording: whether and how claim would fit
// on node, as the scheduler's Filter asks before it picks a node.
func (c *Cluster) Try(ctx context.Context, a structured.Allocator, claim *resourceapi.ResourceClaim, node string) (*resourceapi.AllocationResult, error) {
	n, ok := c.nodes[node]
	if !ok {
		return nil, fmt.Errorf("no node %s", node)
	}
	results, err := a.Allocate(ctx, n, []*resourceapi.ResourceClaim{claim})
	if err != nil || len(results) == 0 {
		return nil, err
	}
	return &results[0], nil
}

// AllocateWith is Allocate with an allocator the caller reuses.
func (c *Cluster) AllocateWith(ctx context.Context, a structured.Allocator, claim *resourceapi.ResourceClaim, node string) (*resourceapi.AllocationResult, error) {
	r, err := c.Try(ctx, a, claim, node)
	if r != nil {
		c.Record(r)
	}
	return r, err
}

// Record adds an allocation to the state, as the scheduler does for every
// allocated claim it knows of.
func (c *Cluster) Record(r *resourceapi.AllocationResult) {
	for _, d := range r.Devices.Results {
		id := structured.MakeDeviceID(d.Driver, d.Pool, d.Device)
		if d.ShareID == nil {
			c.state.AllocatedDevices.Insert(id)
			continue
		}
		c.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, d.ShareID))
		if d.ConsumedCapacity != nil {
			c.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, d.ConsumedCapacity))
		}
	}
}

// Release removes an allocation from the state, as deleting its claim does.
func (c *Cluster) Release(r *resourceapi.AllocationResult) {
	for _, d := range r.Devices.Results {
		id := structured.MakeDeviceID(d.Driver, d.Pool, d.Device)
		if d.ShareID == nil {
			c.state.AllocatedDevices.Delete(id)
			continue
		}
		c.state.AllocatedSharedDeviceIDs.Delete(structured.MakeSharedDeviceID(id, d.ShareID))
		if d.ConsumedCapacity != nil {
			c.state.AggregatedCapacity.Remove(structured.NewDeviceConsumedCapacity(id, d.ConsumedCapacity))
		}
	}
}

// Claim builds a claim with one request for count devices of a class,
// defaulted as the API server would (the allocator does no defaulting).
func Claim(name, class string, count int64, mutate ...func(*resourceapi.DeviceRequest)) *resourceapi.ResourceClaim {
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           count,
	}}
	for _, m := range mutate {
		m(&req)
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}
}

// WithSelector adds a CEL selector to a request.
func WithSelector(expr string) func(*resourceapi.DeviceRequest) {
	return func(r *resourceapi.DeviceRequest) {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	}
}

// WithCapacity asks for an amount of a capacity.
func WithCapacity(name string, amount string) func(*resourceapi.DeviceRequest) {
	return func(r *resourceapi.DeviceRequest) {
		if r.Exactly.Capacity == nil {
			r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		}
		r.Exactly.Capacity.Requests[resourceapi.QualifiedName(name)] = resource.MustParse(amount)
	}
}

// WithTolerations adds tolerations to a request.
func WithTolerations(t ...resourceapi.DeviceToleration) func(*resourceapi.DeviceRequest) {
	return func(r *resourceapi.DeviceRequest) { r.Exactly.Tolerations = append(r.Exactly.Tolerations, t...) }
}

// ExtendedResourceClaim builds the claim the scheduler makes for a pod
// that asks for an extended resource served by a DeviceClass (its
// extendedResourceName), or an error if no class serves it.
func (c *Cluster) ExtendedResourceClaim(name string, resourceName v1.ResourceName, quantity int64) (*resourceapi.ResourceClaim, error) {
	var names []string
	for n := range c.classes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		dc := c.classes[n]
		if dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName == string(resourceName) {
			return Claim(name, dc.Name, quantity), nil
		}
	}
	return nil, fmt.Errorf("no DeviceClass maps extended resource %s (classes: %s)", resourceName, strings.Join(names, ", "))
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, dc := range l {
		out = append(out, dc)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	dc, ok := l[name]
	if !ok {
		return nil, fmt.Errorf("device class %s not found", name)
	}
	return dc, nil
}
