package draresources

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// Blocked returns the groups of plan that cannot be handed out while the
// groups held (device names, such as g0-1x) are in use: every group that
// shares a GPU with a held group and excludes it. A held group is never
// blocked, even if it overlaps another held group (a state only a stale
// checkpoint or a changed configuration can produce): its counters must
// stay visible to the scheduler.
func Blocked(plan *planner.Plan, held []string) map[string]bool {
	var inUse []*planner.Group
	for _, name := range held {
		if g := plan.GroupByDevice(name); g != nil {
			inUse = append(inUse, g)
		}
	}
	out := map[string]bool{}
	for _, g := range plan.Groups() {
		if slices.Contains(held, g.DeviceName()) {
			continue
		}
		if slices.ContainsFunc(inUse, g.Excludes) {
			out[g.DeviceName()] = true
		}
	}
	return out
}

// HideBlocked removes from res, shared layout, the devices of groups
// blocked by the held groups, and returns how many it removed. It keeps
// every slice, even one left empty, so that the pool's slice count and
// with it the pool's generation stay the same: a change then updates one
// slice in one API call, which the scheduler sees at once or not at all.
//
// Hiding a blocked group is safe because the scheduler would refuse it
// anyway: it overlaps a held group that stays published, whose allocation
// still consumes the shared GPU counters. Publishing it again when the
// held group is released is what makes it allocatable, so a claim never
// waits for more than the plugin's next publish.
func HideBlocked(res resourceslice.DriverResources, plan *planner.Plan, held []string) int {
	blocked := Blocked(plan, held)
	if len(blocked) == 0 {
		return 0
	}
	hidden := 0
	for name, pool := range res.Pools {
		for i, s := range pool.Slices {
			if len(s.Devices) == 0 {
				continue
			}
			kept := slices.DeleteFunc(slices.Clone(s.Devices), func(d resourceapi.Device) bool { return blocked[d.Name] })
			hidden += len(s.Devices) - len(kept)
			pool.Slices[i].Devices = kept
		}
		res.Pools[name] = pool
	}
	return hidden
}
