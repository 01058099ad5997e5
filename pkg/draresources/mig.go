package draresources

// MIG seats through counters alone.
//
// Every instance a MIG profile may take on one of its GPUs (a profile at
// one placement) is a device of its own, published before it exists. Three
// rules must hold between them and the whole-GPU groups, and the
// scheduler's allocator enforces only counters:
//
//   - instances whose placements overlap exclude each other: each GPU with
//     MIG profiles has one counter per memory slice (gpu0-slice0 …
//     gpu0-slice7, value 1) and an instance consumes those of its
//     placement;
//   - an instance and a whole-GPU group of its GPU exclude each other: the
//     GPU's counter in the gpus set is worth its memory slices (gpu0 = 8)
//     instead of 1; every group on it consumes all 8, every instance its
//     own size. An instance held leaves less than 8, a group held leaves 0;
//     two instances never add up past 8, their slices being disjoint;
//   - a profile never has more instances than its seats (the model's
//     maximum, one for 1g.10gb+me over seven placements, or fewer when
//     configured): where the seats are fewer than the placements, a
//     counter gpu0-seats-<profile> of that value, one per instance.
//
// The per-slice counters are not consumed by whole-GPU groups; the
// aggregate counter stands for them. The alternative, every group
// consuming all eight slice counters of each of its GPUs, needs 64
// counters for an 8-GPU group, which the API lets one device consume from
// at most two sets of 32: it works on 8 GPUs only if every group's GPUs
// lie in at most two sets, and on 16 not at all. With the aggregate, group
// devices consume what they did before (one counter per GPU, one set) and
// an instance two sets: gpus and the set holding its GPU's slice counters.
//
// A GPU's slice and seat counters (8, plus one per MIG profile with fewer
// seats than placements: at most 15) stay in one set, so that an instance
// consumes from one set besides gpus; sets hold whole GPUs up to the 32
// counters a set may have, and counter slices up to 8 sets each.
//
// Memory slices disjoint also keep the compute slices within the GPU's
// seven on these models (every placement that covers slice 7 has fewer
// compute than memory slices), which TestMIGCountersAgreeWithCoexist
// checks against mig.Coexist for every set of instances.

import (
	"fmt"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// The attributes every MIG device carries, besides the configured ones
// (whose profile, gpuIndices and memoryMiB then describe the instance's
// GPU and the instance).
const (
	// AttrType is "mig" on a MIG device.
	AttrType resourceapi.QualifiedName = "type"
	// AttrMIGProfile is the MIG profile as nvidia-smi names it: 1g.10gb.
	AttrMIGProfile resourceapi.QualifiedName = "migProfile"
	// AttrPlacementStart and AttrPlacementSize are the instance's memory
	// slices, {start}:size.
	AttrPlacementStart resourceapi.QualifiedName = "placementStart"
	AttrPlacementSize  resourceapi.QualifiedName = "placementSize"
	// AttrParentUUID is the UUID of the instance's GPU.
	AttrParentUUID resourceapi.QualifiedName = "parentUUID"

	// MIGCounterSetPrefix names the sets of the GPUs' slice counters:
	// mig-0, mig-1, …
	MIGCounterSetPrefix = "mig-"
)

// SliceCounterName is the counter of memory slice s of GPU i.
func SliceCounterName(i, s int) string { return fmt.Sprintf("gpu%d-slice%d", i, s) }

// SeatsCounterName is the counter of a MIG profile's seats on GPU i.
func SeatsCounterName(i int, profile string) string {
	return "gpu" + strconv.Itoa(i) + "-seats-" + profile
}

// migCounters are the counters of a plan's MIG GPUs.
type migCounters struct {
	// weight is the value of a MIG GPU's counter in the gpus set: its
	// memory slices. GPUs without MIG profiles are absent (value 1).
	weight map[int]int64
	// setOf is the set that holds a MIG GPU's slice and seat counters.
	setOf map[int]string
	sets  []resourceapi.CounterSet
}

func newMIGCounters(plan *planner.Plan) *migCounters {
	models := plan.MIGModels()
	if len(models) == 0 {
		return nil
	}
	mc := &migCounters{weight: map[int]int64{}, setOf: map[int]string{}}
	perGPU := map[int]map[string]resourceapi.Counter{}
	for i, m := range models {
		mc.weight[i] = int64(m.MemorySlices)
		perGPU[i] = map[string]resourceapi.Counter{}
		for s := 0; s < m.MemorySlices; s++ {
			perGPU[i][SliceCounterName(i, s)] = counter(1)
		}
	}
	for _, prof := range plan.Profiles {
		if prof.MIG == nil {
			continue
		}
		for _, g := range prof.MIG.GPUs {
			if g.Seats < len(g.Profile.Placements) {
				perGPU[g.Index()][SeatsCounterName(g.Index(), prof.Name)] = counter(int64(g.Seats))
			}
		}
	}
	gpus := make([]int, 0, len(perGPU))
	for i := range perGPU {
		gpus = append(gpus, i)
	}
	slices.Sort(gpus)
	var cur *resourceapi.CounterSet
	for _, i := range gpus {
		if cur == nil || len(cur.Counters)+len(perGPU[i]) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
			mc.sets = append(mc.sets, resourceapi.CounterSet{Name: MIGCounterSetPrefix + strconv.Itoa(len(mc.sets)), Counters: map[string]resourceapi.Counter{}})
			cur = &mc.sets[len(mc.sets)-1]
		}
		for name, c := range perGPU[i] {
			cur.Counters[name] = c
		}
		mc.setOf[i] = cur.Name
	}
	return mc
}

// gpuWeight is what a whole-GPU group consumes of GPU i's counter.
func (mc *migCounters) gpuWeight(i int) int64 {
	if mc == nil {
		return 1
	}
	if w, ok := mc.weight[i]; ok {
		return w
	}
	return 1
}

// counterSlices are the counter-only slices of the pool: the gpus set and
// the MIG sets, at most ResourceSliceMaxCounterSets per slice.
func (mc *migCounters) counterSlices(gpus resourceapi.CounterSet) []resourceslice.Slice {
	sets := []resourceapi.CounterSet{gpus}
	if mc != nil {
		sets = append(sets, mc.sets...)
	}
	var out []resourceslice.Slice
	for len(sets) > 0 {
		n := min(resourceapi.ResourceSliceMaxCounterSets, len(sets))
		out = append(out, resourceslice.Slice{SharedCounters: sets[:n:n]})
		sets = sets[n:]
	}
	return out
}

// migDevice is one instance a MIG profile may take, as a device: one seat,
// an ordinary device (allocated, the allocator skips it before any
// selector), consuming its size of its GPU's counter in gpus and its
// memory slices (and a seat, where they are counted) in its GPU's set.
func (mc *migCounters) migDevice(d planner.MIGDevice, inv *inventory.Inventory, attrs []v1alpha1.AttributeName) resourceapi.Device {
	gpu := d.GPU.Index()
	a := Attributes(d.GPU.Group, inv, attrs)
	if _, ok := a[resourceapi.QualifiedName(v1alpha1.AttrMemoryMiB)]; ok {
		a[resourceapi.QualifiedName(v1alpha1.AttrMemoryMiB)] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.GPU.Profile.MemoryMiB))}
	}
	a[resourceapi.QualifiedName(v1alpha1.AttrGPUIndices)] = resourceapi.DeviceAttribute{StringValue: ptr.To(strconv.Itoa(gpu))}
	a[AttrType] = resourceapi.DeviceAttribute{StringValue: ptr.To("mig")}
	a[AttrMIGProfile] = resourceapi.DeviceAttribute{StringValue: ptr.To(d.GPU.Profile.Name)}
	a[AttrPlacementStart] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.Placement.Start))}
	a[AttrPlacementSize] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.Placement.Size))}
	if uuid := inv.GPUs[gpu].UUID; uuid != "" {
		a[AttrParentUUID] = resourceapi.DeviceAttribute{StringValue: &uuid}
	}
	slicesUsed := map[string]resourceapi.Counter{}
	for s := d.Placement.Start; s < d.Placement.End(); s++ {
		slicesUsed[SliceCounterName(gpu, s)] = counter(1)
	}
	if d.GPU.Seats < len(d.GPU.Profile.Placements) {
		slicesUsed[SeatsCounterName(gpu, d.Profile().Name)] = counter(1)
	}
	return resourceapi.Device{
		Name:       d.DeviceName(),
		Attributes: a,
		Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{SeatsCapacity: {Value: *resource.NewQuantity(1, resource.DecimalSI)}},
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{
			{CounterSet: CounterSet, Counters: map[string]resourceapi.Counter{CounterName(gpu): counter(int64(d.Placement.Size))}},
			{CounterSet: mc.setOf[gpu], Counters: slicesUsed},
		},
	}
}

// counter is a counter of value v, parsed as the gpus set's counters
// always were, so that a node without MIG publishes the same objects.
func counter(v int64) resourceapi.Counter {
	return resourceapi.Counter{Value: resource.MustParse(strconv.FormatInt(v, 10))}
}

// migDeviceGroups maps every MIG device name of plan to its GPU's group,
// for what applies to a GPU's devices whatever they are (taints).
func migDeviceGroups(plan *planner.Plan) map[string]*planner.Group {
	out := map[string]*planner.Group{}
	for _, d := range plan.MIGDevices() {
		out[d.DeviceName()] = d.GPU.Group
	}
	return out
}
