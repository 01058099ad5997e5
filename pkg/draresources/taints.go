package draresources

import (
	"regexp"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// TaintKey is the key of the taint on every device whose group contains
// an unhealthy GPU. A claim that tolerates it (operator Exists, or Equal
// with a reason such as xid-79) can still be allocated such a device.
const TaintKey = driver.Name + "/unhealthy"

// Fault is how an unhealthy GPU taints the devices of its groups.
type Fault struct {
	// Reason is the taint's value, such as xid-79 or gpu-lost. The API
	// takes label values only (63 characters of [A-Za-z0-9._-]); other
	// characters become '-'.
	Reason string
	// Effect is NoSchedule or NoExecute.
	Effect resourceapi.DeviceTaintEffect
}

// Faults are the unhealthy GPUs by index.
type Faults map[int]Fault

// Taint puts a taint on every device of res whose group contains an
// unhealthy GPU, in either layout: a GPU's failure keeps the scheduler
// off exactly the groups that contain it. TimeAdded is left to the API
// server, and the resourceslice controller keeps it while the taint stays
// the same.
func Taint(res resourceslice.DriverResources, plan *planner.Plan, faults Faults) {
	if len(faults) == 0 {
		return
	}
	eachGroupDevice(res, plan, func(d *resourceapi.Device, g *planner.Group) {
		if t, ok := GroupTaint(g.GPUs, faults); ok {
			d.Taints = append(d.Taints, t)
		}
	})
}

// eachGroupDevice calls f with every device of res that is a group of
// plan's (or a seat of one) and its group, and with every MIG device and
// its GPU as a group of one.
func eachGroupDevice(res resourceslice.DriverResources, plan *planner.Plan, f func(*resourceapi.Device, *planner.Group)) {
	idx := Index(plan)
	migs := migDeviceGroups(plan)
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			for i := range s.Devices {
				if ref, ok := idx[s.Devices[i].Name]; ok {
					f(&s.Devices[i], ref.Group)
				} else if g, ok := migs[s.Devices[i].Name]; ok {
					f(&s.Devices[i], g)
				}
			}
		}
	}
}

// TaintDevices puts taints on the devices of res they name, by device
// name. A device that carries a taint of the same key already keeps that
// one alone: one taint per key, and the one put first (a GPU's fault
// before a MIG instance's) is the stronger.
func TaintDevices(res resourceslice.DriverResources, taints map[string]resourceapi.DeviceTaint) {
	if len(taints) == 0 {
		return
	}
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			for i := range s.Devices {
				dev := &s.Devices[i]
				t, ok := taints[dev.Name]
				if !ok || slices.ContainsFunc(dev.Taints, func(have resourceapi.DeviceTaint) bool { return have.Key == t.Key }) {
					continue
				}
				t.Value = labelValue(t.Value)
				dev.Taints = append(dev.Taints, t)
			}
		}
	}
}

// FencedTaintKey is the key of the taint on every device whose group
// contains a fenced GPU: one a held claim still uses through a group the
// configuration no longer defines so, or through seats that could not be
// recovered. Its value says which (earlier-configuration, seats-unknown).
// It is NoSchedule: the held claim keeps running, no new claim lands on
// those GPUs until it is released.
const FencedTaintKey = driver.Name + "/fenced"

// Fence taints every device of res whose group contains a GPU of fenced
// (GPU index to the taint's value), in either layout.
func Fence(res resourceslice.DriverResources, plan *planner.Plan, fenced map[int]string) {
	if len(fenced) == 0 {
		return
	}
	eachGroupDevice(res, plan, func(d *resourceapi.Device, g *planner.Group) {
		// The first fenced GPU (group GPUs are ascending) names the cause.
		for _, x := range g.GPUs {
			if why, ok := fenced[x]; ok {
				d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: FencedTaintKey, Value: labelValue(why), Effect: resourceapi.DeviceTaintEffectNoSchedule})
				return
			}
		}
	})
}

// GroupTaint is the taint of a group of GPUs: the strongest effect of its
// unhealthy GPUs, and as value the reason of the first GPU with that
// effect. One taint per device, not one per GPU, so that a toleration of
// the key covers a group however many of its GPUs failed.
func GroupTaint(gpus []int, faults Faults) (resourceapi.DeviceTaint, bool) {
	sorted := slices.Clone(gpus)
	slices.Sort(sorted)
	var worst *Fault
	for _, x := range sorted {
		f, ok := faults[x]
		if !ok {
			continue
		}
		if worst == nil || (f.Effect == resourceapi.DeviceTaintEffectNoExecute && worst.Effect != resourceapi.DeviceTaintEffectNoExecute) {
			worst = &f
		}
	}
	if worst == nil {
		return resourceapi.DeviceTaint{}, false
	}
	effect := worst.Effect
	if effect == "" {
		effect = resourceapi.DeviceTaintEffectNoSchedule
	}
	return resourceapi.DeviceTaint{Key: TaintKey, Value: labelValue(worst.Reason), Effect: effect}, true
}

var notLabelChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// labelValue makes a reason a valid label value: "unhealthy" if nothing
// of it is left.
func labelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 && s != "" {
		return s
	}
	s = notLabelChars.ReplaceAllString(s, "-")
	if len(s) > validation.LabelValueMaxLength {
		s = s[:validation.LabelValueMaxLength]
	}
	s = strings.TrimFunc(s, func(r rune) bool { return r == '-' || r == '.' || r == '_' })
	if s == "" {
		return "unhealthy"
	}
	return s
}
