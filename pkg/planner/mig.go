package planner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// A MIG profile's seats are GPU instances: on each of its GPUs, up to
// SeatsPerGroup instances of one MIG profile, each at one of the profile's
// placements on the GPU's memory slices. Its groups are single GPUs, kept
// in MIGSeats.GPUs and not in Profile.Groups: every reader of
// Profile.Groups (the device-plugin shim, the exclusive layout, the prepare
// path) hands out a group's GPUs whole, which a MIG seat must never be
// given. Each (GPU, placement) is a device of its own (MIGDevices); which
// of them can be in use at once is the publisher's to express.

// MIGSeats are the seats of a MIG profile.
type MIGSeats struct {
	// Profile is the MIG profile as nvidia-smi names it: 1g.10gb.
	Profile string
	// GPUs are the profile's GPUs, by index.
	GPUs []*MIGGPU
	// Unavailable are the GPUs the profile would have if NVML gave their
	// MIG geometry, by index: they publish no MIG device of it.
	Unavailable []UnavailableMIGGPU
}

// UnavailableMIGGPU is a GPU of a MIG profile without MIG geometry.
type UnavailableMIGGPU struct {
	GPU int
	// Capable: the GPU has MIG, but NVML would not give its geometry.
	Capable bool
	// Reason says why (inventory.GPU.NoMIG).
	Reason string
}

// MIGGPU is one GPU of a MIG profile.
type MIGGPU struct {
	// Group is the GPU as a group of one (name G0, NUMA node, PCIe root),
	// of the MIG profile.
	Group *Group
	// Model is the GPU's MIG geometry as NVML gives it
	// (inventory.GPU.MIG), Profile the MIG profile in it.
	Model   mig.Model
	Profile mig.Profile
	// Seats is how many instances of Profile the GPU offers at most.
	Seats int
}

// Index is the GPU's NVML index.
func (g *MIGGPU) Index() int { return g.Group.GPUs[0] }

// MIGDevice is one instance a MIG profile may take: a profile, a GPU, a
// placement. Each is one seat.
type MIGDevice struct {
	GPU       *MIGGPU
	Placement mig.Placement
}

// Profile is the seat profile the device serves.
func (d MIGDevice) Profile() *Profile { return d.GPU.Group.Profile }

// DeviceName is the device's name in the ResourceSlice: the GPU's group,
// the profile and the placement's first memory slice, such as
// g0-mig-1g-10gb-6.
func (d MIGDevice) DeviceName() string {
	return d.GPU.Group.DeviceName() + "-" + strconv.Itoa(d.Placement.Start)
}

// Instance is the GPU instance the device stands for.
func (d MIGDevice) Instance() mig.Instance {
	return mig.Instance{Profile: d.GPU.Profile, Placement: d.Placement}
}

// HasMIG says whether any profile of the plan is a MIG profile.
func (p *Plan) HasMIG() bool {
	return slices.ContainsFunc(p.Profiles, func(prof *Profile) bool { return prof.MIG != nil })
}

// MIGModels returns, for every GPU that serves a MIG profile, its MIG
// geometry.
func (p *Plan) MIGModels() map[int]mig.Model {
	out := map[int]mig.Model{}
	for _, prof := range p.Profiles {
		if prof.MIG == nil {
			continue
		}
		for _, g := range prof.MIG.GPUs {
			out[g.Index()] = g.Model
		}
	}
	return out
}

// MIGUnavailable is a GPU that MIG profiles of the plan would have, had
// NVML given its MIG geometry.
type MIGUnavailable struct {
	UnavailableMIGGPU
	// Profiles are those profiles' names.
	Profiles []string
}

// MIGUnavailable returns the GPUs of MIG profiles that publish no MIG
// device for want of geometry, by index.
func (p *Plan) MIGUnavailable() []MIGUnavailable {
	byGPU := map[int]*MIGUnavailable{}
	for _, prof := range p.Profiles {
		if prof.MIG == nil {
			continue
		}
		for _, u := range prof.MIG.Unavailable {
			if byGPU[u.GPU] == nil {
				byGPU[u.GPU] = &MIGUnavailable{UnavailableMIGGPU: u}
			}
			byGPU[u.GPU].Profiles = append(byGPU[u.GPU].Profiles, prof.Name)
		}
	}
	out := make([]MIGUnavailable, 0, len(byGPU))
	for _, u := range byGPU {
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b MIGUnavailable) int { return a.GPU - b.GPU })
	return out
}

// MIGDevices returns every instance of every MIG profile in the order the
// scheduler should try them: profiles in plan order; GPUs in the plan's
// policy order (pack: those outside larger groups first, then one larger
// group's GPUs together, so that MIG seats fill GPUs that already hold
// some; spread: farthest first); placements from the last memory slice
// down, which keeps the placement at slice 0, the only one the largest
// profiles (4g, 7g) have, free the longest. With pack a GPU's placements
// come together; with spread each next seat goes to the next GPU.
func (p *Plan) MIGDevices() []MIGDevice {
	var out []MIGDevice
	for _, prof := range p.Profiles {
		if prof.MIG == nil {
			continue
		}
		byIndex := map[int]*MIGGPU{}
		view := *prof
		view.Groups = nil
		for _, g := range prof.MIG.GPUs {
			byIndex[g.Index()] = g
			view.Groups = append(view.Groups, g.Group)
		}
		order := p.packOrder(&view)
		if p.Policy == v1alpha1.PolicySpread {
			order = p.spreadOrder(order)
		}
		placements := func(g *MIGGPU) []mig.Placement {
			pl := slices.Clone(g.Profile.Placements)
			slices.Reverse(pl)
			return pl
		}
		if p.Policy == v1alpha1.PolicySpread {
			for k := 0; ; k++ {
				added := false
				for _, grp := range order {
					g := byIndex[grp.GPUs[0]]
					if pl := placements(g); k < len(pl) {
						out = append(out, MIGDevice{GPU: g, Placement: pl[k]})
						added = true
					}
				}
				if !added {
					break
				}
			}
			continue
		}
		for _, grp := range order {
			g := byIndex[grp.GPUs[0]]
			for _, pl := range placements(g) {
				out = append(out, MIGDevice{GPU: g, Placement: pl})
			}
		}
	}
	return out
}

// migGPUs are a MIG profile's GPUs among allowed, each checked against the
// geometry NVML gives for it; problems are errors on the profile's fields
// at path. A GPU without geometry (no MIG, or NVML would not give it) is
// no error: one configuration serves every node of a fleet, as with a
// profile a node cannot form, so it is left out of the profile, in
// Unavailable, with a warning. A MIG profile the GPU's geometry lacks is
// an error: the configuration asks this GPU for an instance it cannot
// make, a misspelt name or another model's profile (1g.10gb on an H200),
// which a silent node would hide.
func migGPUs(inv *inventory.Inventory, cfg *v1alpha1.NodeConfig, plan *Plan, prof *Profile, allowed []int, path *field.Path, errs *v1alpha1.FieldErrors) []*MIGGPU {
	var seatsCfg *int
	if i := pathIndex(path); i >= 0 && i < len(cfg.Profiles) && cfg.Profiles[i].MIG != nil {
		seatsCfg = cfg.Profiles[i].MIG.SeatsPerGPU
	}
	profilePath := path.Child("mig", "profile")
	// One error per cause, not per GPU: a node of eight alike GPUs has
	// one problem, not eight.
	reported := map[string]bool{}
	report := func(p *field.Path, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if !reported[p.String()+msg] {
			reported[p.String()+msg] = true
			errs.Add(p, "%s", msg)
		}
	}
	var out []*MIGGPU
	for _, idx := range allowed {
		gpu := inv.GPUs[idx]
		if gpu.MIG == nil {
			prof.MIG.Unavailable = append(prof.MIG.Unavailable, UnavailableMIGGPU{GPU: idx, Capable: gpu.MIGCapable, Reason: gpu.NoMIG})
			continue
		}
		model := *gpu.MIG
		mp, err := model.Profile(prof.MIG.Profile)
		if err != nil {
			report(profilePath, "%v", err)
			continue
		}
		seats := mp.MaxInstances
		if seatsCfg != nil {
			if *seatsCfg > mp.MaxInstances {
				report(path.Child("mig", "seatsPerGPU"), "%d seats per GPU, but %s holds at most %d instance(s) of %s per GPU", *seatsCfg, model.Name, mp.MaxInstances, mp.Name)
				continue
			}
			seats = *seatsCfg
		}
		g := &Group{Name: autoName([]int{idx}, len(inv.GPUs)), Profile: prof, GPUs: []int{idx}}
		describeGroup(inv, g)
		out = append(out, &MIGGPU{Group: g, Model: model, Profile: mp, Seats: seats})
	}
	plan.Warnings = append(plan.Warnings, unavailableWarnings(inv, prof)...)
	if len(out) > 0 {
		prof.SeatsPerGroup = out[0].Seats
	}
	return out
}

// unavailableWarnings say, one per product and reason, which GPUs of a
// MIG profile publish no MIG device of it and why.
func unavailableWarnings(inv *inventory.Inventory, prof *Profile) []string {
	type cause struct{ product, reason string }
	var causes []cause
	byCause := map[cause][]string{}
	for _, u := range prof.MIG.Unavailable {
		c := cause{inv.GPUs[u.GPU].ProductName, u.Reason}
		if _, ok := byCause[c]; !ok {
			causes = append(causes, c)
		}
		byCause[c] = append(byCause[c], strconv.Itoa(u.GPU))
	}
	out := make([]string, 0, len(causes))
	for _, c := range causes {
		out = append(out, fmt.Sprintf("profile %s (MIG %s): GPU %s (%s) publish no MIG device, as NVML gives no MIG geometry for them (%s); restrict the profile with gpus to silence this",
			prof.Name, prof.MIG.Profile, strings.Join(byCause[c], ", "), c.product, c.reason))
	}
	return out
}

// checkMIGTogether refuses what MIG profiles cannot share a GPU with: the
// same MIG profile twice (two profiles' seat limits would add up past
// what the GPU holds), and an overprovisioned profile, whose groups
// consume no counters and so could not be kept off a GPU whose instances
// are in use.
func checkMIGTogether(profiles []*Profile, paths []*field.Path, errs *v1alpha1.FieldErrors) {
	type owner struct {
		path *field.Path
		prof *Profile
	}
	byGPU := map[int][]owner{}
	for i, prof := range profiles {
		if prof.MIG == nil {
			continue
		}
		for _, g := range prof.MIG.GPUs {
			for _, o := range byGPU[g.Index()] {
				if o.prof.MIG.Profile == prof.MIG.Profile {
					errs.Add(paths[i].Child("mig", "profile"), "GPU %d already offers %s through %s; one profile per MIG profile and GPU (give them disjoint gpus lists)", g.Index(), prof.MIG.Profile, o.path)
				}
			}
			byGPU[g.Index()] = append(byGPU[g.Index()], owner{paths[i], prof})
		}
	}
	for i, prof := range profiles {
		if !prof.AllowOverprovision {
			continue
		}
		for _, g := range prof.Groups {
			if o := firstOwner(byGPU, g.GPUs); o != nil {
				errs.Add(paths[i].Child("allowOverprovision"), "group %s shares GPU %s with MIG profile %s (%s); an overprovisioned group could not be kept off a GPU whose MIG instances are in use: give them disjoint gpus lists", g.Name, g.GPUList(), o.prof.Name, o.path)
				break
			}
		}
	}
}

func firstOwner[T any](byGPU map[int][]T, gpus []int) *T {
	for _, x := range gpus {
		if list := byGPU[x]; len(list) > 0 {
			return &list[0]
		}
	}
	return nil
}

// checkDeviceNames refuses two devices of one name, which the API server
// would refuse in one pool: a MIG device is named after its GPU, profile
// and placement (g0-mig-1g-10gb-6), and a profile named mig-1g-10gb-6
// would give a group device of the same name.
func checkDeviceNames(plan *Plan, errs *v1alpha1.FieldErrors) {
	seen := map[string]string{}
	for _, g := range plan.Groups() {
		seen[g.DeviceName()] = "group " + g.Name + " of profile " + g.Profile.Name
	}
	for _, d := range plan.MIGDevices() {
		if other, dup := seen[d.DeviceName()]; dup {
			errs.Add(field.NewPath("profiles"), "device name %s of MIG profile %s is also that of %s; rename a profile", d.DeviceName(), d.Profile().Name, other)
			return
		}
		seen[d.DeviceName()] = "MIG profile " + d.Profile().Name
	}
}
