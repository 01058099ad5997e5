package doctor

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// The sized-seats check holds what each group of a sized profile
// publishes against what the checkpoint's claims hold there, and against
// what the group's MPS daemon was last told. Held sizes add up to more
// than a group publishes only where the configuration or the GPUs changed
// under held claims, or a claim was allocated beside the scheduler: the
// plugin then refuses every further claim of the group at prepare until
// enough are released. A daemon's limits are the largest memory and the
// largest compute one claim holds there (docs/design.md, "Sized seats"):
// other limits let a container pin more than its size, or refuse it the
// size it was given. The plugin sets them at each prepare and release and
// at its start; the doctor reads the daemon's record and asks the daemon
// nothing.

// groupHold is what the checkpoint's claims hold on one group device.
type groupHold struct {
	// sized are the sized seats held, sum their sizes added up, largest
	// the most memory and, on its own, the most compute one claim holds.
	sized          int
	sum, largest   v1alpha1.SeatSize
	equalSeats     int // the most seats of an equal share one claim holds
	fenced         bool
	claimsWithSize []string
}

// holds reads, per group device, what st's claims hold there.
func holds(st *checkpoint.State) map[string]*groupHold {
	out := map[string]*groupHold{}
	for _, uid := range slices.Sorted(maps.Keys(st.Claims)) {
		c := st.Claims[uid]
		own := map[string]v1alpha1.SeatSize{}
		seats := map[string]int{}
		for _, d := range c.Devices {
			if d.AdminAccess {
				continue
			}
			h := out[d.GroupDevice]
			if h == nil {
				h = &groupHold{}
				out[d.GroupDevice] = h
			}
			switch {
			case d.Fenced:
				h.fenced = true
			case d.Size != nil:
				h.sized++
				h.sum = h.sum.Add(*d.Size)
				own[d.GroupDevice] = own[d.GroupDevice].Add(*d.Size)
				h.claimsWithSize = append(h.claimsWithSize, fmt.Sprintf("%s/%s (%s, %d %%)", c.Namespace, c.Name, quantity(d.Size.MemoryBytes), d.Size.ComputePercent))
			default:
				seats[d.GroupDevice] += max(len(d.Seats), 1)
			}
		}
		for gd, s := range own {
			out[gd].largest = out[gd].largest.Max(s)
		}
		for gd, n := range seats {
			out[gd].equalSeats = max(out[gd].equalSeats, n)
		}
	}
	return out
}

// hasSizes reports whether the node has sized seats to examine: a sized
// profile in today's plan, or sized seats held in the checkpoint.
func (e *examination) hasSizes() bool {
	if e.node != nil && slices.ContainsFunc(e.node.Plan.Profiles, func(p *planner.Profile) bool { return p.Sizes != nil }) {
		return true
	}
	if e.state == nil {
		return false
	}
	for _, c := range e.state.Claims {
		if slices.ContainsFunc(c.Devices, func(d checkpoint.Device) bool { return d.Size != nil }) {
			return true
		}
	}
	return false
}

func (e *examination) checkSizedSeats(context.Context) {
	c := Check{Name: "sized-seats", Status: OK}
	var warnings []string
	warn := func(format string, args ...any) {
		c.Details = append(c.Details, "warning: "+fmt.Sprintf(format, args...))
		warnings = append(warnings, fmt.Sprintf(format, args...))
	}
	held := map[string]*groupHold{}
	if e.state != nil {
		held = holds(e.state)
	} else {
		warn("the checkpoint could not be read: the sizes held are not known")
	}
	root := e.opts.MPSRoot
	if root == "" {
		root = filepath.Join(driver.PluginDir(e.opts.PluginsDir), "mps")
	}
	groups, seats := 0, 0
	sizedToday := map[string]bool{}
	if e.node != nil {
		hw := &groupshare.Hardware{Inv: e.node.Inv}
		for _, g := range e.node.Plan.Groups() {
			sizes, ok := g.Sizes()
			if !ok {
				continue
			}
			groups++
			sizedToday[g.DeviceName()] = true
			h := held[g.DeviceName()]
			if h == nil {
				h = &groupHold{}
			}
			seats += h.sized
			line := fmt.Sprintf("%s (%s, GPUs %s): publishes %s, %s; ", g.Name, g.DeviceName(), g.GPUList(), count(int(sizes.Seats), "seat"), sizes)
			if h.sized == 0 {
				line += "none held"
			} else {
				line += fmt.Sprintf("%s %s %s and %d %%: %v", count(h.sized, "sized seat"), holdVerb(h.sized), quantity(h.sum.MemoryBytes), h.sum.ComputePercent, h.claimsWithSize)
			}
			c.Details = append(c.Details, line)
			if h.sum.MemoryBytes > sizes.Memory.Capacity || h.sum.ComputePercent > sizes.Compute.Capacity || int64(h.sized) > sizes.Seats {
				warn("group %s's claims hold more than it publishes (%s of %s per GPU, %d of %d %%, %d of %d seats): the plugin refuses every further claim of the group at prepare until enough are released",
					g.Name, quantity(h.sum.MemoryBytes), quantity(sizes.Memory.Capacity), h.sum.ComputePercent, sizes.Compute.Capacity, h.sized, sizes.Seats)
			}
			if h.sized > 0 && !h.fenced {
				if w := daemonMismatch(root, g, hw, h); w != "" {
					warn("%s", w)
				}
			}
		}
	}
	for _, gd := range slices.Sorted(maps.Keys(held)) {
		if h := held[gd]; h.sized > 0 && !sizedToday[gd] && e.node != nil {
			warn("%s %s sized seats of %s, which today's plan does not publish as a sized group: %v; the plugin holds their MPS limits until they are released",
				count(h.sized, "claim"), holdVerb(h.sized), gd, h.claimsWithSize)
		}
	}
	c.Summary = fmt.Sprintf("%s; %s held", count(groups, "sized group"), count(seats, "sized seat"))
	if len(warnings) > 0 {
		c.Status = Warn
		c.Fix = "a group holding more than it publishes frees as its claims are released (delete their pods to hurry it); the plugin sets an MPS daemon's limits to the largest size held at every prepare and release on the group and at its start (restart it if they stay wrong); sizes held on a group no longer sized keep their limits until released"
	}
	e.add(c)
}

// daemonMismatch says how g's MPS daemon, as its record has it, differs
// from what its claims need: the largest share held, as the plugin
// computes it (sharedseats). "" where it agrees.
func daemonMismatch(root string, g *planner.Group, hw *groupshare.Hardware, h *groupHold) string {
	want, _ := hw.Want(g, h.equalSeats)
	want = mps.Max(want, hw.Sized(g, h.largest))
	rec, err := mps.ReadRecord(root, g.DeviceName())
	switch {
	case err != nil:
		return fmt.Sprintf("group %s: %v", g.Name, err)
	case rec == nil:
		return fmt.Sprintf("no MPS daemon is recorded for group %s, whose sized seats are held: their containers reach no daemon until the plugin starts one (at its start, and its watcher's next check)", g.Name)
	case rec.Limits == nil:
		return fmt.Sprintf("the MPS daemon of group %s has no limits recorded; its claims need %s", g.Name, limits(want))
	case !rec.Limits.Equal(want):
		return fmt.Sprintf("the MPS daemon of group %s holds %s, and the largest size held there needs %s: a container may pin more than its size, or less than it was given", g.Name, limits(*rec.Limits), limits(want))
	}
	return ""
}

func holdVerb(n int) string {
	if n == 1 {
		return "holds"
	}
	return "hold"
}

// limits renders MPS limits as a client's environment says them.
func limits(l mps.Limits) string {
	return fmt.Sprintf("%d %% of the SMs and %s", l.ActiveThreadPercentage, l.MemLimitEnv())
}

// quantity renders a size as the API writes a quantity: 20Gi.
func quantity(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}
