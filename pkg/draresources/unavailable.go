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

// Held is the seats in use per group device (such as g0-1x).
type Held map[string]int

// Devices are the held group devices, sorted.
func (h Held) Devices() []string {
	out := make([]string, 0, len(h))
	for name, n := range h {
		if n > 0 {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Unavailable returns the groups of plan that cannot take another claim
// while held is in use: those blocked by an overlapping held group, and
// those with every seat held.
func Unavailable(plan *planner.Plan, held Held) map[string]bool {
	out := Blocked(plan, held.Devices())
	for _, g := range plan.Groups() {
		if n := held[g.DeviceName()]; n > 0 && n >= g.Seats() {
			out[g.DeviceName()] = true
		}
	}
	return out
}

// HideUnavailable removes from res, shared layout, the devices of the
// groups that cannot take another claim (Unavailable), and returns how
// many it removed. It keeps every slice, even one left empty, so that the
// pool's slice count and with it the pool's generation stay the same: a
// change then updates one slice in one API call, which the scheduler sees
// at once or not at all.
//
// Hiding them changes no decision of the scheduler, which would refuse
// them anyway, and spares it the work of finding that out: its allocator
// builds the CEL input of a shared device before it looks at the
// device's free capacity, on every node, for every claim.
//
// A blocked group overlaps a held group. A full group is held, and hiding
// it takes its allocations out of the scheduler's count of the shared GPU
// counters (the allocator counts only the published devices it finds
// allocated); that is safe only because every group that shares a GPU
// with it is blocked and hidden in the same slice update, so no published
// device consumes those counters. An overprovisioned group consumes no
// counters at all. Publishing a group again when a seat of it, or the
// group that blocked it, is released is what makes it allocatable, so a
// claim never waits for more than the plugin's next publish.
func HideUnavailable(res resourceslice.DriverResources, plan *planner.Plan, held Held) int {
	hide := Unavailable(plan, held)
	if len(hide) == 0 {
		return 0
	}
	hidden := 0
	for name, pool := range res.Pools {
		for i, s := range pool.Slices {
			if len(s.Devices) == 0 {
				continue
			}
			kept := slices.DeleteFunc(slices.Clone(s.Devices), func(d resourceapi.Device) bool { return hide[d.Name] })
			hidden += len(s.Devices) - len(kept)
			pool.Slices[i].Devices = kept
		}
		res.Pools[name] = pool
	}
	return hidden
}
