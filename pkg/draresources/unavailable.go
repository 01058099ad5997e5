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

// HideBlocked removes from res, shared layout, the devices of the groups
// that hold no seat and are blocked by an overlapping group in use
// (Blocked), and returns how many it removed: unavailableGroups:
// hideBlocked, an opt-in. It keeps every slice, even one left empty, so
// that the pool's slice count and with it the pool's generation stay the
// same: a change then updates one slice in one API call, which the
// scheduler sees at once or not at all.
//
// Hiding them changes no decision of the scheduler, which would refuse
// them anyway (the held group consumes their GPUs' counters), and spares
// it the work of finding that out: its allocator evaluates a device's
// selectors before it checks its counters, on every node, for every claim.
//
// A group that holds a seat is never hidden, full or not: its allocations
// are what the scheduler counts the shared GPU counters from, a device
// missing from its pool while allocated is what upstream is moving to
// refuse (kubernetes#140802), and an admin-access claim may only select a
// published device. An overprovisioned group consumes no counters and is
// never blocked. Publishing a group again when the group that blocked it
// is released is what makes it allocatable, so a claim never waits for
// more than the plugin's next publish.
//
// What it costs: the published devices then depend on the claims held, so
// a busy node's slices no longer describe what a new node of its kind
// offers (the Cluster Autoscaler copies them into its node templates).
// That is why it is not the default.
func HideBlocked(res resourceslice.DriverResources, plan *planner.Plan, held Held) int {
	hide := Blocked(plan, held.Devices())
	if len(hide) == 0 {
		return 0
	}
	return removeDevices(res, func(d *resourceapi.Device) bool { return hide[d.Name] })
}

// removeDevices removes from the slices of res the devices drop names,
// and returns how many it removed. Every slice stays, emptied or not, so
// that the pools keep their slice counts. drop may change a device it
// keeps.
func removeDevices(res resourceslice.DriverResources, drop func(d *resourceapi.Device) bool) int {
	removed := 0
	for name, pool := range res.Pools {
		for i, s := range pool.Slices {
			if len(s.Devices) == 0 {
				continue
			}
			kept := make([]resourceapi.Device, 0, len(s.Devices))
			for _, d := range s.Devices {
				if !drop(&d) {
					kept = append(kept, d)
				}
			}
			removed += len(s.Devices) - len(kept)
			pool.Slices[i].Devices = kept
		}
		res.Pools[name] = pool
	}
	return removed
}
