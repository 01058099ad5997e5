package doctor

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// checkCheckpoint reads the plugin's checkpoint as the plugin would at
// start, and holds it against today's plan and the specs on disk: what the
// plugin will repair, fence or refuse when it starts.
func (e *examination) checkCheckpoint() {
	dir := driver.PluginDir(e.opts.PluginsDir)
	c := Check{Name: "checkpoint", Status: OK}
	specs, _, specErr := cdi.ListClaims(e.opts.CDIRoot)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		e.state = checkpoint.New()
		c.Summary = "none: the plugin has not run on this node yet"
		e.add(withOrphans(c, specs, nil))
		return
	}
	st, res, err := checkpoint.NewStore(dir).Load()
	if err == nil {
		e.state = st
	}
	switch {
	case errors.Is(err, checkpoint.ErrNewerVersion):
		e.add(Check{Name: "checkpoint", Status: Fail, Summary: err.Error(),
			Fix: "a newer plugin ran on this node and this one refuses to start rather than lose its state: roll the plugin forward again"})
		return
	case err != nil:
		e.add(Check{Name: "checkpoint", Status: Warn, Summary: err.Error(),
			Fix: "the plugin rebuilds it at start from the claims allocated on this node and the specs on disk (it needs the API server); seats it cannot prove stay fenced until their claims are released"})
		return
	case res.Fresh:
		c.Summary = "none yet: the plugin starts fresh"
		e.add(withOrphans(c, specs, nil))
		return
	case res.RecoveredFrom != nil:
		c.Status = Warn
		c.Details = append(c.Details, "the current file is unusable: "+res.RecoveredFrom.Error())
		c.Fix = "the plugin uses the previous copy if every spec on disk agrees with it, and rebuilds otherwise"
	}
	seats, fenced := 0, 0
	for _, uid := range slices.Sorted(maps.Keys(st.Claims)) {
		cl := st.Claims[uid]
		for _, d := range cl.Devices {
			seats += len(d.Seats)
			if d.Fenced {
				fenced++
				c.Details = append(c.Details, fmt.Sprintf("claim %s/%s (%s) fences group %s: its seats are not known, none of its GPUs is handed out until it is released", cl.Namespace, cl.Name, uid, d.Group))
			}
			if why := e.heldElsewhere(d); why != "" {
				c.Details = append(c.Details, fmt.Sprintf("claim %s/%s (%s) holds %s %v: %s", cl.Namespace, cl.Name, uid, d.Group, d.GPUs, why))
				fenced++
			}
		}
	}
	c.Summary = fmt.Sprintf("%s hold %s", count(len(st.Claims), "claim"), count(seats, "seat"))
	if fenced > 0 && c.Status == OK {
		c.Status = Warn
		c.Fix = "the GPUs named stay fenced until their claims are released: delete the pods that hold them to free them"
	}
	if specErr != nil {
		c.Details = append(c.Details, specErr.Error())
	}
	e.add(withOrphans(c, specs, st))
}

// withOrphans warns of specs on disk that the checkpoint does not record:
// the plugin rebuilds at start when it finds them.
func withOrphans(c Check, specs []types.UID, st *checkpoint.State) Check {
	var orphans []types.UID
	for _, uid := range specs {
		if st == nil || st.Claims[uid] == nil {
			orphans = append(orphans, uid)
		}
	}
	if len(orphans) == 0 {
		return c
	}
	c.Details = append(c.Details, fmt.Sprintf("%s the checkpoint does not record: %v", count(len(orphans), "claim spec"), orphans))
	if c.Status == OK {
		c.Status = Warn
		c.Fix = "the checkpoint is behind the node: the plugin rebuilds it at start from the claims allocated here (it needs the API server), and fences what it cannot prove"
	}
	return c
}

// heldElsewhere says why a held device no longer matches the node: its
// group was redefined or its GPUs were swapped since it was prepared.
func (e *examination) heldElsewhere(d checkpoint.Device) string {
	if e.node == nil {
		return ""
	}
	for i, x := range d.GPUs {
		g, ok := e.node.Inv.GPUByIndex(x)
		switch {
		case !ok:
			return fmt.Sprintf("GPU %d no longer exists", x)
		case i < len(d.GPUUUIDs) && g.UUID != d.GPUUUIDs[i]:
			return fmt.Sprintf("GPU %d is now %s, not %s", x, g.UUID, d.GPUUUIDs[i])
		}
	}
	for _, g := range e.node.Plan.Groups() {
		if g.Name == d.Group && g.Profile.Name == d.Profile {
			if slices.Equal(g.GPUs, d.GPUs) {
				return ""
			}
			return fmt.Sprintf("today's configuration puts %s on GPUs %v", g.Name, g.GPUs)
		}
	}
	return "today's plan has no such group"
}
