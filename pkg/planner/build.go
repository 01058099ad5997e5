package planner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// MaxGPUs is the most GPUs a node may have: the driver publishes one
// counter per GPU, and a ResourceSlice counter set holds at most 32.
const MaxGPUs = 32

// DefaultSizes are the group sizes of the default profiles.
var DefaultSizes = []int{1, 2, 4}

// New plans the node. cfg must be validated and defaulted
// (v1alpha1.LoadNodeConfig does both); nil means the defaults. Errors name
// the config field at fault (as v1alpha1.FieldErrors, which a
// v1alpha1.Source can annotate with lines).
func New(inv *inventory.Inventory, cfg *v1alpha1.NodeConfig) (*Plan, error) {
	if cfg == nil {
		cfg = &v1alpha1.NodeConfig{}
		cfg.SetDefaults()
	}
	n := len(inv.GPUs)
	if n == 0 {
		return nil, inventory.ErrNoGPUs
	}
	if n > MaxGPUs {
		return nil, fmt.Errorf("the node has %d GPUs; the driver supports at most %d per node", n, MaxGPUs)
	}
	plan := &Plan{GPUs: n, Policy: cfg.AllocationPolicy, Attributes: slices.Clone(cfg.Attributes), HideBlocked: cfg.UnavailableGroups == v1alpha1.UnavailableGroupsHideBlocked || cfg.UnavailableGroups == v1alpha1.UnavailableGroupsHide, links: inv.Links}
	var errs v1alpha1.FieldErrors
	profiles, paths := profilesFor(cfg, n, plan)
	for i := range profiles {
		checkIndices(gpuRestriction(cfg, paths[i]), paths[i], n, &errs)
	}
	explicits := explicitGroups(cfg, profiles, n, &errs)
	if len(errs) > 0 {
		return nil, errs
	}
	for pi, prof := range profiles {
		allowed := allowedGPUs(cfg, paths[pi], n)
		if prof.MIG != nil {
			prof.MIG.GPUs = migGPUs(inv, cfg, plan, prof, allowed, paths[pi], &errs)
			continue
		}
		prof.Groups = profileGroups(inv, cfg, prof, allowed, explicits, &errs)
		for _, g := range prof.Groups {
			if g.Explicit && g.Interconnect == inventory.ClassSystem {
				plan.Warnings = append(plan.Warnings, fmt.Sprintf("group %s (%s) spans sockets: GPUs %s share no NUMA node", g.Name, prof.Name, g.GPUList()))
			}
		}
		if len(prof.Groups) == 0 {
			plan.Warnings = append(plan.Warnings, fmt.Sprintf("profile %s has no groups on this node (%d GPUs, %d per group)", prof.Name, len(allowed), prof.Size))
		}
		checkSizes(prof, paths[pi], &errs)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	checkMIGTogether(profiles, paths, &errs)
	plan.Profiles = profiles
	checkDeviceNames(plan, &errs)
	if len(errs) > 0 {
		return nil, errs
	}
	return plan, nil
}

// explicit is a group named in the configuration, with its field path.
type explicit struct {
	group v1alpha1.Group
	path  *field.Path
}

// explicitGroups are the configuration's groups that exist on this node
// (n GPUs) and fit a profile; the others are errors.
func explicitGroups(cfg *v1alpha1.NodeConfig, profiles []*Profile, n int, errs *v1alpha1.FieldErrors) []explicit {
	var out []explicit
	for i, g := range cfg.Groups {
		path := field.NewPath("groups").Index(i)
		bad := false
		for j, idx := range g.GPUs {
			if idx >= n {
				errs.Add(path.Child("gpus").Index(j), "GPU %d does not exist on this node (%s)", idx, gpuCount(n))
				bad = true
			}
		}
		if !slices.ContainsFunc(profiles, func(p *Profile) bool { return p.Size == len(g.GPUs) }) {
			errs.Add(path.Child("gpus"), "%d GPUs, but no profile has groups of %d (profiles: %s)", len(g.GPUs), len(g.GPUs), describeSizes(profiles))
			bad = true
		}
		if !bad {
			out = append(out, explicit{g, path})
		}
	}
	return out
}

// profileGroups are prof's groups on the allowed GPUs: the explicit groups
// of its size first, then (with grouping: auto) groups formed from the
// topology out of the GPUs they leave, sorted by GPUs and described.
func profileGroups(inv *inventory.Inventory, cfg *v1alpha1.NodeConfig, prof *Profile, allowed []int, explicits []explicit, errs *v1alpha1.FieldErrors) []*Group {
	var mine []*Group
	taken := map[int]string{}
	for _, e := range explicits {
		if len(e.group.GPUs) != prof.Size || !subset(e.group.GPUs, allowed) {
			continue
		}
		gpus := slices.Sorted(slices.Values(e.group.GPUs))
		for j, idx := range e.group.GPUs {
			if other, dup := taken[idx]; dup {
				errs.Add(e.path.Child("gpus").Index(j), "GPU %d is already in group %s; groups of one size must not overlap", idx, other)
			}
		}
		for _, idx := range gpus {
			taken[idx] = e.group.Name
		}
		mine = append(mine, &Group{Name: e.group.Name, Profile: prof, GPUs: gpus, Explicit: true})
	}
	if cfg.Grouping == v1alpha1.GroupingAuto || cfg.Grouping == "" {
		var free []int
		for _, idx := range allowed {
			if _, ok := taken[idx]; !ok {
				free = append(free, idx)
			}
		}
		for _, gpus := range autoGroups(inv, free, prof.Size) {
			name := autoName(gpus, len(inv.GPUs))
			for _, g := range mine {
				if strings.EqualFold(g.Name, name) {
					errs.Add(field.NewPath("groups"), "group %q is also the automatic name of GPUs %v in profile %s; rename it", g.Name, gpus, prof.Name)
				}
			}
			mine = append(mine, &Group{Name: name, Profile: prof, GPUs: gpus})
		}
	}
	slices.SortFunc(mine, func(a, b *Group) int { return slices.Compare(a.GPUs, b.GPUs) })
	for _, g := range mine {
		describeGroup(inv, g)
	}
	return mine
}

// profilesFor returns the plan's profiles sorted by size, and for each the
// config path it came from (nil for a default profile).
func profilesFor(cfg *v1alpha1.NodeConfig, n int, plan *Plan) ([]*Profile, []*field.Path) {
	type entry struct {
		prof *Profile
		path *field.Path
	}
	var entries []entry
	if len(cfg.Profiles) == 0 {
		for _, size := range DefaultSizes {
			if size > n {
				continue
			}
			p := v1alpha1.StandardProfile(size)
			p.SetDefaults()
			entries = append(entries, entry{prof: fromConfig(p)})
		}
	} else {
		for i, p := range cfg.Profiles {
			p.SetDefaults()
			entries = append(entries, entry{prof: fromConfig(p), path: field.NewPath("profiles").Index(i)})
		}
	}
	slices.SortStableFunc(entries, func(a, b entry) int {
		if a.prof.Size != b.prof.Size {
			return a.prof.Size - b.prof.Size
		}
		return strings.Compare(a.prof.Name, b.prof.Name)
	})
	profiles := make([]*Profile, len(entries))
	paths := make([]*field.Path, len(entries))
	for i, e := range entries {
		profiles[i], paths[i] = e.prof, e.path
	}
	return profiles, paths
}

func fromConfig(p v1alpha1.Profile) *Profile {
	return &Profile{
		Name:               p.Name,
		Resource:           p.Resource,
		Size:               p.Size(),
		SeatsPerGroup:      p.Seats(),
		AllowOverprovision: p.AllowOverprovision,
		Sharing:            p.SharingStrategy(),
		TimeSlice:          p.TimeSliceInterval(),
		MPSComputeMode:     p.MPSComputeMode(),
		MIG:                migSeats(p),
		Sizes:              sizeRules(p),
	}
}

func sizeRules(p v1alpha1.Profile) *v1alpha1.SizeRules {
	r, ok := p.SizeRules()
	if !ok {
		return nil
	}
	return &r
}

func migSeats(p v1alpha1.Profile) *MIGSeats {
	if p.MIG == nil {
		return nil
	}
	return &MIGSeats{Profile: p.MIG.Profile}
}

// gpuRestriction returns the profile's configured GPU list, if any.
func gpuRestriction(cfg *v1alpha1.NodeConfig, path *field.Path) []int {
	if path == nil {
		return nil
	}
	i := pathIndex(path)
	if i < 0 || i >= len(cfg.Profiles) {
		return nil
	}
	return cfg.Profiles[i].GPUs
}

func allowedGPUs(cfg *v1alpha1.NodeConfig, path *field.Path, n int) []int {
	var out []int
	if r := gpuRestriction(cfg, path); len(r) > 0 {
		for _, x := range r {
			if x < n {
				out = append(out, x)
			}
		}
		slices.Sort(out)
		return out
	}
	for i := 0; i < n; i++ {
		out = append(out, i)
	}
	return out
}

func checkIndices(indices []int, path *field.Path, n int, errs *v1alpha1.FieldErrors) {
	for j, idx := range indices {
		if idx >= n {
			errs.Add(path.Child("gpus").Index(j), "GPU %d does not exist on this node (%s)", idx, gpuCount(n))
		}
	}
}

// pathIndex reads i back from a "profiles[i]" path.
func pathIndex(path *field.Path) int {
	s := path.String()
	open := strings.LastIndexByte(s, '[')
	if open < 0 {
		return -1
	}
	i, err := strconv.Atoi(strings.TrimSuffix(s[open+1:], "]"))
	if err != nil {
		return -1
	}
	return i
}

func describeSizes(profiles []*Profile) string {
	parts := make([]string, len(profiles))
	for i, p := range profiles {
		parts[i] = fmt.Sprintf("%s=%d", p.Name, p.Size)
	}
	return strings.Join(parts, ", ")
}

func subset(a, b []int) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// autoName names a derived group by its GPU indices, each padded to the
// width of the node's largest index so that names cannot collide: G01,
// G4567 on 8 GPUs, G0809 on 16.
func autoName(gpus []int, n int) string {
	width := len(strconv.Itoa(n - 1))
	var b strings.Builder
	b.WriteByte('G')
	for _, g := range gpus {
		fmt.Fprintf(&b, "%0*d", width, g)
	}
	return b.String()
}

// describeGroup fills the derived properties of a group.
func describeGroup(inv *inventory.Inventory, g *Group) {
	g.Interconnect = inventory.ClassNone
	g.NUMANode = inv.GPUs[g.GPUs[0]].NUMANode
	g.PCIeRoot = inv.GPUs[g.GPUs[0]].PCIeRoot
	g.MemoryMiB = inv.GPUs[g.GPUs[0]].MemoryMiB
	for _, x := range g.GPUs[1:] {
		g.MemoryMiB = min(g.MemoryMiB, inv.GPUs[x].MemoryMiB)
		if inv.GPUs[x].NUMANode != g.NUMANode {
			g.NUMANode = -1
		}
		if inv.GPUs[x].PCIeRoot != g.PCIeRoot {
			g.PCIeRoot = ""
		}
	}
	if len(g.GPUs) > 1 {
		g.Weakest = weakest(inv, g.GPUs)
		g.Interconnect = g.Weakest.Class()
	}
}

// weakest returns the weakest link among all pairs of gpus.
func weakest(inv *inventory.Inventory, gpus []int) inventory.Link {
	var w inventory.Link
	first := true
	for i := 0; i < len(gpus); i++ {
		for j := i + 1; j < len(gpus); j++ {
			l := inv.Link(gpus[i], gpus[j])
			if first || inventory.Better(w, l) {
				w, first = l, false
			}
		}
	}
	return w
}

func gpuCount(n int) string {
	if n == 1 {
		return "1 GPU"
	}
	return strconv.Itoa(n) + " GPUs"
}
