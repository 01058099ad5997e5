package draresources

// MIG partitions the plugin did not make.
//
// A GPU instance that exists when the plugin starts and that it did not
// make (an administrator's, another tool's) is never destroyed. Where it
// is a seat of a MIG profile the GPU is configured for (that profile, at
// one of its placements, holding one compute instance that spans it), its
// device stays published, marked static: a claim allocated it adopts the
// instance. Otherwise what it makes impossible is not published: every MIG
// device whose placement overlaps it (no instance can be made there), and
// every whole-GPU group with its GPU (a GPU in MIG mode with an instance
// on it is no whole GPU). A static seat withdraws the same around it, bar
// its own device.
//
// The alternative, publishing everything and letting the counters or NVML
// refuse, would have the scheduler hand out devices whose prepare can only
// fail: the counters know nothing of an instance no device stands for.
// The counters stay as they are: a static device consumes its placement's
// as any MIG device, and a withdrawn device consumes nothing.
//
// A GPU given to a MIG profile that is not in MIG mode, on an architecture
// where turning it on needs a GPU reset, has every MIG device withdrawn
// the same way (WithdrawMIGOf); its whole-GPU groups stay.

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// AttrStatic is true on a MIG device that stands for an instance the
// plugin did not make and does not destroy; the attribute is absent on
// the others.
const AttrStatic resourceapi.QualifiedName = "static"

// MIGPartition is a GPU instance on a MIG GPU that the plugin did not
// make.
type MIGPartition struct {
	GPU       int
	Placement mig.Placement
	// Seat is the MIG device the instance is a static seat of; empty
	// where it is none.
	Seat string
}

// WithdrawAroundPartitions removes from res the devices that parts make
// impossible and marks the static seats' devices, and returns how many it
// removed. Like HideBlocked it keeps every slice, even one left empty.
func WithdrawAroundPartitions(res resourceslice.DriverResources, plan *planner.Plan, parts []MIGPartition) int {
	if len(parts) == 0 {
		return 0
	}
	onGPU := map[int][]mig.Placement{}
	static := map[string]bool{}
	for _, p := range parts {
		onGPU[p.GPU] = append(onGPU[p.GPU], p.Placement)
		if p.Seat != "" {
			static[p.Seat] = true
		}
	}
	migs := map[string]planner.MIGDevice{}
	for _, d := range plan.MIGDevices() {
		migs[d.DeviceName()] = d
	}
	idx := Index(plan)
	impossible := func(d *resourceapi.Device) bool {
		if m, ok := migs[d.Name]; ok {
			if static[d.Name] {
				d.Attributes[AttrStatic] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
				return false
			}
			return slices.ContainsFunc(onGPU[m.GPU.Index()], func(pl mig.Placement) bool { return mig.Overlaps(pl, m.Placement) })
		}
		ref, ok := idx[d.Name]
		return ok && slices.ContainsFunc(ref.Group.GPUs, func(i int) bool { return len(onGPU[i]) > 0 })
	}
	return removeDevices(res, impossible)
}

// WithdrawMIGOf removes from res the MIG devices of gpus, GPUs that
// cannot be put in MIG mode without a reset the plugin does not do, and
// returns how many it removed. Their whole-GPU groups stay: the GPU
// serves them as usual. Like HideBlocked it keeps every slice.
func WithdrawMIGOf(res resourceslice.DriverResources, plan *planner.Plan, gpus []int) int {
	if len(gpus) == 0 {
		return 0
	}
	off := map[string]bool{}
	for _, d := range plan.MIGDevices() {
		if slices.Contains(gpus, d.GPU.Index()) {
			off[d.DeviceName()] = true
		}
	}
	return removeDevices(res, func(d *resourceapi.Device) bool { return off[d.Name] })
}
