package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/durablefile"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// The MIG checks hold each GPU's MIG state against the plan: one check
// per GPU that the configuration gives to a MIG profile, and one per GPU
// whose MIG mode is on (or pending) although no MIG profile has it. They
// read NVML, the plugin's journal of the instances it made, the kernel's
// mig-minors and the capability device nodes; they make, destroy and
// switch nothing, and an instance no journal record names is reported,
// never touched, as the plugin leaves it.

// migGPUPlan is what the plan gives one GPU: its MIG profiles by name.
type migGPUPlan struct {
	model    mig.Model
	profiles []string
}

// migInstance is a GPU instance found on a GPU, with its compute
// instances' MIG devices.
type migInstance struct {
	gi        int
	profile   string
	placement mig.Placement
	cis       []migComputeInstance
}

type migComputeInstance struct {
	ci   int
	uuid string
	// whole: the compute instance spans its GPU instance.
	whole bool
}

// migExam is the MIG step: what every GPU's check reads once (the plan's
// MIG profiles by GPU, the GPUs in whole-GPU groups, the plugin's
// journal, mig-minors) and the host it reads them from.
type migExam struct {
	host     *gpuhost.Host
	planned  map[int]*migGPUPlan
	inGroups map[int]bool
	// records are the journal's, journalDamage and journalErr what
	// reading it found (miginstance.ReadJournal).
	records                   []miginstance.Record
	journalDamage, journalErr error
	// earlier counts by GPU the journal's records of another boot than
	// the node's, left out of records: no MIG instance outlives a
	// reboot, and the plugin forgets them at its next start.
	earlier map[int]int
	// minors is mig-minors, read at the first GPU in MIG mode.
	minors    *mig.Minors
	minorsErr error
}

// newMIGExam reads what the checks hold the GPUs against. bootID is the
// node's boot (Options.BootID).
func newMIGExam(host *gpuhost.Host, plan *planner.Plan, pluginDir, bootID string) *migExam {
	x := &migExam{host: host, planned: map[int]*migGPUPlan{}, inGroups: map[int]bool{}, earlier: map[int]int{}}
	for _, prof := range plan.Profiles {
		for _, g := range prof.Groups {
			for _, i := range g.GPUs {
				x.inGroups[i] = true
			}
		}
		if prof.MIG == nil {
			continue
		}
		for _, g := range prof.MIG.GPUs {
			p := x.planned[g.Index()]
			if p == nil {
				p = &migGPUPlan{model: g.Model}
				x.planned[g.Index()] = p
			}
			p.profiles = append(p.profiles, g.Profile.Name)
		}
	}
	records, damage, err := miginstance.ReadJournal(pluginDir)
	x.journalDamage, x.journalErr = damage, err
	for _, r := range records {
		// A record of no known boot (an older journal's) is judged as the
		// plugin judges it: by its instance.
		if bootID != "" && r.Boot != "" && r.Boot != bootID {
			x.earlier[r.GPU]++
			continue
		}
		x.records = append(x.records, r)
	}
	return x
}

// checkMIG adds the MIG checks, where the plan has a MIG profile or a GPU
// is in MIG mode.
func (e *examination) checkMIG(_ context.Context) {
	if e.host == nil || e.inv == nil || e.node == nil {
		return
	}
	unavailable := map[int]bool{}
	for _, u := range e.node.Plan.MIGUnavailable() {
		unavailable[u.GPU] = true
		e.add(migUnavailableCheck(e.inv.GPUs[u.GPU], u))
	}
	x := newMIGExam(e.host, e.node.Plan, driver.PluginDir(e.opts.PluginsDir), e.opts.BootID)
	for _, g := range e.inv.GPUs {
		if unavailable[g.Index] {
			continue
		}
		if c, ok := x.check(g); ok {
			e.add(c)
		}
	}
}

// check is GPU g's check; none (false) for a GPU without MIG that no MIG
// profile has, or one whose MIG mode is off and not pending that none
// has.
func (x *migExam) check(g inventory.GPU) (Check, bool) {
	plan := x.planned[g.Index]
	dev, ret := x.host.NVML.DeviceGetHandleByIndex(g.Index)
	if ret != nvml.SUCCESS {
		return Check{Name: migCheckName(g.Index), Status: Fail, Summary: fmt.Sprintf("GPU %d: DeviceGetHandleByIndex: %s", g.Index, nvml.ErrorString(ret)),
			Fix: "run nvidia-smi -i " + fmt.Sprint(g.Index) + " on the node: NVML answers it the same way"}, plan != nil
	}
	current, pending, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS && plan == nil {
		return Check{}, false // a GPU without MIG that no MIG profile has
	}
	if ret != nvml.SUCCESS {
		return Check{Name: migCheckName(g.Index), Status: Fail, Summary: fmt.Sprintf("GPU %d: read its MIG mode: GetMigMode: %s", g.Index, nvml.ErrorString(ret)),
			Fix: "the configuration gives this GPU to a MIG profile; nvidia-smi -i " + fmt.Sprint(g.Index) + " -q -d MIG shows what the driver says"}, true
	}
	if plan == nil && current != nvml.DEVICE_MIG_ENABLE && pending != nvml.DEVICE_MIG_ENABLE {
		return Check{}, false
	}
	if x.minors == nil && x.minorsErr == nil {
		x.minors, x.minorsErr = x.readMinors()
	}
	c := migModeCheck(g, plan, x.inGroups[g.Index], current, pending)
	if current == nvml.DEVICE_MIG_ENABLE {
		instances, err := migInstances(dev, plan, g)
		if err != nil {
			c = worse(c, Fail, "GPU "+fmt.Sprint(g.Index)+": list its MIG instances: "+err.Error(), "nvidia-smi mig -lgi -i "+fmt.Sprint(g.Index)+" lists them as NVML does")
		}
		c = x.partitions(c, g, plan, instances)
		c = x.capabilities(c, g, instances)
	}
	return c, true
}

func migCheckName(gpu int) string { return fmt.Sprintf("mig-gpu%d", gpu) }

// migUnavailableCheck reports a GPU that MIG profiles are given but that
// publishes no MIG device, NVML giving no MIG geometry for it: expected
// of a GPU without MIG where one configuration serves a mixed fleet (a
// warning), a fault of the driver or the GPU where it has MIG.
func migUnavailableCheck(g inventory.GPU, u planner.MIGUnavailable) Check {
	c := Check{Name: migCheckName(g.Index), Status: Warn,
		Summary: fmt.Sprintf("GPU %d (%s): MIG profile %s, but it publishes no MIG device: NVML gives no MIG geometry for it (%s)", g.Index, g.ProductName, strings.Join(u.Profiles, ", "), u.Reason),
		Fix:     "the GPU has no MIG: leave it out of the profile's gpus to silence this (its whole-GPU groups are published as usual)",
	}
	switch {
	case u.Capable && strings.Contains(u.Reason, nvml.ErrorString(nvml.ERROR_NO_PERMISSION)):
		// nvml.h: the placements "Require privileged user".
		c.Status = Fail
		c.Fix = "the GPU has MIG, but NVML gives its MIG placements only to a privileged process (root, or one that holds a MIG capability): run the plugin as root (the chart does, UID 0), then restart the plugin pod, which reads the geometry at start"
	case u.Capable:
		c.Status = Fail
		c.Fix = fmt.Sprintf("the GPU has MIG, but NVML would not describe its profiles: nvidia-smi mig -i %d -lgip and -lgipp ask NVML the same; after fixing the driver, restart the plugin pod, which reads the geometry at start", g.Index)
	}
	return c
}

// worse raises a check's status to s (never lowers it), adding a detail
// and, where the check had none or a milder one, the fix.
func worse(c Check, s Status, detail, fix string) Check {
	if detail != "" {
		c.Details = append(c.Details, detail)
	}
	rank := map[Status]int{OK: 0, Warn: 1, Fail: 2}
	if rank[s] > rank[c.Status] {
		c.Status = s
		c.Fix = fix
	} else if rank[s] == rank[c.Status] && fix != "" && !strings.Contains(c.Fix, fix) {
		c.Fix += "; " + fix
	}
	return c
}

// migModeCheck judges a GPU's current and pending MIG modes against what
// the plan gives it.
func migModeCheck(g inventory.GPU, plan *migGPUPlan, inGroups bool, current, pending int) Check {
	i := g.Index
	c := Check{Name: migCheckName(i), Status: OK}
	on := func(m int) string {
		if m == nvml.DEVICE_MIG_ENABLE {
			return "on"
		}
		return "off"
	}
	mode := fmt.Sprintf("MIG mode %s", on(current))
	if pending != current {
		mode += fmt.Sprintf(", %s pending (at the GPU's next reset)", on(pending))
	}
	resetless := !mig.ModeChangeNeedsReset(g.Architecture)
	if plan == nil {
		c.Summary = fmt.Sprintf("GPU %d (%s): %s; no MIG profile of the configuration has this GPU", i, g.ProductName, mode)
		switch {
		case current == nvml.DEVICE_MIG_ENABLE && inGroups:
			c.Status = Fail
			c.Fix = fmt.Sprintf("a container given this GPU whole sees no CUDA device while MIG mode is on: give the GPU to a MIG profile (its gpus), or drain it and turn MIG off (nvidia-smi -i %d -mig 0%s)", i, resetHint(resetless, i))
		case current == nvml.DEVICE_MIG_ENABLE:
			c.Status = Warn
			c.Fix = fmt.Sprintf("no seat of the plan uses this GPU; give it to a MIG profile, or turn MIG off (nvidia-smi -i %d -mig 0%s)", i, resetHint(resetless, i))
		default:
			c.Status = Warn
			c.Fix = fmt.Sprintf("at the GPU's next reset or reboot MIG goes on, and a container given this GPU whole then sees no CUDA device: cancel it (nvidia-smi -i %d -mig 0), or give the GPU to a MIG profile", i)
		}
		return c
	}
	c.Summary = fmt.Sprintf("GPU %d (%s, %s): %s; profiles %s", i, g.ProductName, g.Architecture, mode, strings.Join(plan.profiles, ", "))
	switch {
	case current == nvml.DEVICE_MIG_ENABLE && pending != nvml.DEVICE_MIG_ENABLE:
		c.Status = Warn
		c.Fix = fmt.Sprintf("MIG mode goes off at the GPU's next reset or reboot, and its instances with it; the plugin never turns it off: cancel the change (nvidia-smi -i %d -mig 1)", i)
	case current == nvml.DEVICE_MIG_ENABLE:
	case resetless:
		c.Details = append(c.Details, "the plugin turns MIG mode on at the GPU's first MIG prepare (on "+g.Architecture+" it takes effect at once; it fails while a process runs on the GPU)")
	case pending == nvml.DEVICE_MIG_ENABLE:
		c.Status = Fail
		c.Fix = fmt.Sprintf("on %s GPUs MIG mode takes effect at a GPU reset: drain the GPU, then nvidia-smi -i %d --gpu-reset (or reboot the node), then restart the plugin's pod; until then the plugin does not publish its MIG devices", g.Architecture, i)
	default:
		c.Status = Fail
		c.Fix = fmt.Sprintf("on %s GPUs turning MIG mode on needs a GPU reset, which the plugin never does: drain the GPU, then nvidia-smi -i %d -mig 1 and nvidia-smi -i %d --gpu-reset (or reboot the node; the mode persists), then restart the plugin's pod; until then the plugin does not publish its MIG devices", g.Architecture, i, i)
	}
	return c
}

func resetHint(resetless bool, i int) string {
	if resetless {
		return ""
	}
	return fmt.Sprintf(", then nvidia-smi -i %d --gpu-reset", i)
}

// migInstances lists a GPU's GPU instances, by ID, with their compute
// instances' MIG devices.
func migInstances(dev nvml.Device, plan *migGPUPlan, g inventory.GPU) ([]migInstance, error) {
	model := mig.Model{}
	if plan != nil {
		model = plan.model
	} else if g.MIG != nil {
		model = *g.MIG
	}
	gis, err := miginstance.ListGPUInstances(dev)
	if err != nil {
		return nil, err
	}
	out := make([]migInstance, 0, len(gis))
	for _, g := range gis {
		name := fmt.Sprintf("profile ID %d", g.ProfileID)
		if p, err := model.ProfileByID(g.ProfileID); err == nil {
			name = p.Name
		}
		out = append(out, migInstance{gi: g.ID, profile: name, placement: g.Placement})
	}
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetMaxMigDeviceCount: %s", nvml.ErrorString(ret))
	}
	for i := range n {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GetMigDeviceHandleByIndex(%d): %s", i, nvml.ErrorString(ret))
		}
		giID, ret1 := md.GetGpuInstanceId()
		ciID, ret2 := md.GetComputeInstanceId()
		uuid, ret3 := md.GetUUID()
		attrs, ret4 := md.GetAttributes()
		if ret := firstFailure(ret1, ret2, ret3, ret4); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("MIG device %d: its GPU instance, compute instance, UUID or attributes: %s", i, nvml.ErrorString(ret))
		}
		for k := range out {
			if out[k].gi == giID {
				out[k].cis = append(out[k].cis, migComputeInstance{ci: ciID, uuid: uuid, whole: attrs.ComputeInstanceSliceCount == attrs.GpuInstanceSliceCount})
			}
		}
	}
	return out, nil
}

func firstFailure(rets ...nvml.Return) nvml.Return {
	for _, r := range rets {
		if r != nvml.SUCCESS {
			return r
		}
	}
	return nvml.SUCCESS
}

// partitions holds a GPU's instances against its profiles and the
// plugin's journal. An instance no record names was not made by the
// plugin and is never touched: one of a profile the GPU is given, with one
// compute instance spanning it, is a static seat (published, adopted by
// the claim allocated it); any other is reported, and the plugin
// publishes neither the MIG devices it overlaps nor its GPU's whole-GPU
// groups.
func (x *migExam) partitions(c Check, g inventory.GPU, plan *migGPUPlan, instances []migInstance) Check {
	switch {
	case errors.Is(x.journalErr, durablefile.ErrNewerVersion):
		c = worse(c, Fail, x.journalErr.Error(), "a newer plugin wrote the MIG journal: this one fails every MIG prepare rather than touch it; run the newer plugin")
	case x.journalErr != nil:
		c = worse(c, Warn, x.journalErr.Error(), "the MIG journal and its previous copy are damaged: the plugin sets them aside and rebuilds the journal from the GPUs and the seat checkpoint at its next start; an instance no held claim names is then left as one it did not make")
	case x.journalDamage != nil:
		c = worse(c, Warn, x.journalDamage.Error(), "the MIG journal is damaged: the plugin uses its previous copy at its next start and sets the damaged file aside")
	}
	c.Summary += fmt.Sprintf("; %s", count(len(instances), "GPU instance"))
	if n := x.earlier[g.Index]; n > 0 {
		c.Details = append(c.Details, fmt.Sprintf("journal: %s of an earlier boot, forgotten at the plugin's next start: no MIG instance outlives a reboot, and what is at their placements now is not the plugin's", count(n, "record")))
	}
	for _, in := range instances {
		line := fmt.Sprintf("GI %d: %s at %s", in.gi, in.profile, in.placement)
		for _, ci := range in.cis {
			line += fmt.Sprintf(", CI %d %s", ci.ci, ci.uuid)
		}
		if len(in.cis) == 0 {
			line += ", no compute instance"
		}
		i := slices.IndexFunc(x.records, func(r miginstance.Record) bool {
			return r.GPU == g.Index && r.Start == in.placement.Start && r.Size == in.placement.Size && r.Profile == in.profile
		})
		configured := plan != nil && slices.Contains(plan.profiles, in.profile)
		// A record names the MIG device its claim's containers were
		// given; an administrator's nvidia-smi mig -dci (and -cci) under
		// a held claim leaves the GPU instance with no such device.
		lost := ""
		if i >= 0 && x.records[i].Phase.Made() && !slices.ContainsFunc(in.cis, func(ci migComputeInstance) bool { return ci.uuid == x.records[i].UUID }) {
			lost = fmt.Sprintf(", whose MIG device %s is gone", x.records[i].UUID)
			c = worse(c, Warn, "", "a claim's containers were given a MIG device that no longer exists: delete the claim's pods; the plugin settles its journal at its next start and the claim's next prepare finds or makes the instance again")
		}
		switch {
		case i >= 0 && x.records[i].Phase == miginstance.Adopted:
			c.Details = append(c.Details, line+fmt.Sprintf(": a static seat (not made by the plugin), adopted by claim %s device %s%s", x.records[i].Claim, x.records[i].Device, lost))
		case i >= 0:
			line += fmt.Sprintf(": the plugin's, claim %s device %s%s", x.records[i].Claim, x.records[i].Device, lost)
			c.Details = append(c.Details, line)
			if !configured {
				c = worse(c, Warn, "", "an instance the plugin made of a profile the configuration no longer gives this GPU stays until its claim is released")
			}
		case configured && len(in.cis) == 1 && in.cis[0].whole:
			c.Details = append(c.Details, line+": not made by the plugin; a static seat, published as such and never destroyed")
		default:
			why := "not a static seat: it holds no compute instance, or several, or one smaller than it"
			if !configured {
				why = "of a profile the configuration does not give this GPU"
			}
			c = worse(c, Warn, line+": not made by the plugin, "+why+"; left as it is",
				fmt.Sprintf("the plugin never touches an instance it did not make, and publishes neither the MIG devices it overlaps nor the GPU's whole-GPU groups; if it is not needed, destroy it (nvidia-smi mig -i %d -gi <GI> -dci, then nvidia-smi mig -i %d -gi <GI> -dgi) and restart the plugin, or make it a static seat: one compute instance spanning it, of a profile the GPU is given", g.Index, g.Index))
		}
	}
	for _, r := range x.records {
		if r.GPU != g.Index || !r.Phase.Made() || slices.ContainsFunc(instances, func(in migInstance) bool {
			return in.placement == r.Placement() && in.profile == r.Profile
		}) {
			continue
		}
		c = worse(c, Warn, fmt.Sprintf("journal: %s %s at %s, claim %s device %s: no such GPU instance, so its MIG device %s is gone", r.Phase, r.Profile, r.Placement(), r.Claim, r.Device, r.UUID),
			"a claim's containers were given a MIG device that no longer exists: delete the claim's pods; the plugin settles its journal at its next start and the claim's next prepare finds or makes the instance again")
	}
	return c
}
