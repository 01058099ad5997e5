package planner

import (
	"fmt"
	"slices"
	"strings"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// Ordered returns every group in the order the scheduler should try them:
// profiles by ascending size (the small, frequent requests find a match
// first and stop scanning early), and inside a profile by the plan's
// policy. The scheduler's allocator is first-fit over the order devices are
// published in, so this order is the placement policy.
//
// pack: groups inside the same larger group are adjacent, so small seats
// fill one larger group's GPUs before they touch the next one, and whole
// 2x/4x groups stay free as long as possible. GPUs that belong to no larger
// group come first: a seat there breaks nothing.
//
// spread: each next group is the one farthest from those before it (its
// closest link to them is the weakest), so consecutive seats land on
// different switches, host bridges and sockets.
func (p *Plan) Ordered() []*Group {
	var out []*Group
	for _, prof := range p.Profiles {
		groups := p.packOrder(prof)
		if p.Policy == v1alpha1.PolicySpread {
			groups = p.spreadOrder(groups)
		}
		out = append(out, groups...)
	}
	return out
}

// OrderedProfile is Ordered restricted to one profile.
func (p *Plan) OrderedProfile(prof *Profile) []*Group {
	groups := p.packOrder(prof)
	if p.Policy == v1alpha1.PolicySpread {
		groups = p.spreadOrder(groups)
	}
	return groups
}

func (p *Plan) packOrder(prof *Profile) []*Group {
	var larger []*Profile
	for _, q := range p.Profiles {
		if q.Size > prof.Size {
			larger = append(larger, q)
		}
	}
	// Largest first: the outermost container decides first.
	slices.SortStableFunc(larger, func(a, b *Profile) int { return b.Size - a.Size })
	key := func(g *Group) []int {
		k := make([]int, 0, len(larger)+1)
		for _, q := range larger {
			k = append(k, containerRank(q, g))
		}
		return append(k, g.GPUs[0])
	}
	groups := slices.Clone(prof.Groups)
	slices.SortStableFunc(groups, func(a, b *Group) int { return slices.Compare(key(a), key(b)) })
	return groups
}

// containerRank is the position, in q's canonical order, of the q-group
// that contains g (or, failing that, holds g's first GPU); -1 when no
// q-group touches g.
func containerRank(q *Profile, g *Group) int {
	for i, c := range q.Groups {
		if subset(g.GPUs, c.GPUs) {
			return i
		}
	}
	for i, c := range q.Groups {
		if slices.Contains(c.GPUs, g.GPUs[0]) {
			return i
		}
	}
	return -1
}

// spreadOrder reorders groups farthest-first, starting from the first.
func (p *Plan) spreadOrder(groups []*Group) []*Group {
	if len(groups) < 3 {
		return groups
	}
	out := []*Group{groups[0]}
	rest := slices.Clone(groups[1:])
	for len(rest) > 0 {
		best := 0
		bestClose := p.closest(rest[0], out)
		for i := 1; i < len(rest); i++ {
			// Strictly farther wins; ties keep pack order.
			if c := p.closest(rest[i], out); farther(c, bestClose) {
				best, bestClose = i, c
			}
		}
		out = append(out, rest[best])
		rest = slices.Delete(rest, best, best+1)
	}
	return out
}

// closeness is how near a group is to a set: its best link to any GPU of
// any group in the set.
type closeness struct {
	shares bool // shares a GPU: nearest of all
	link   linkKey
}

type linkKey struct{ class, nvlinks, pcie int }

func (p *Plan) closest(g *Group, set []*Group) closeness {
	var best closeness
	first := true
	for _, o := range set {
		if g.SharesGPU(o) {
			return closeness{shares: true}
		}
		for _, a := range g.GPUs {
			for _, b := range o.GPUs {
				l := p.links[a][b]
				k := linkKey{class: int(l.Class()), nvlinks: -l.NVLinks, pcie: int(l.PCIe)}
				if first || lessKey(k, best.link) {
					best.link, first = k, false
				}
			}
		}
	}
	return best
}

// farther reports whether a is strictly farther than b.
func farther(a, b closeness) bool {
	if a.shares != b.shares {
		return b.shares
	}
	return lessKey(b.link, a.link)
}

func lessKey(a, b linkKey) bool {
	if a.class != b.class {
		return a.class < b.class
	}
	if a.nvlinks != b.nvlinks {
		return a.nvlinks < b.nvlinks
	}
	return a.pcie < b.pcie
}

// ExclusiveLayout returns a copy of the plan in which no GPU belongs to
// groups of two profiles that exclude each other (profiles that allow
// overprovisioning keep all their groups), with a sentence saying what was
// chosen and why. It is the layout for schedulers that cannot keep
// overlapping groups exclusive: clusters without consumable capacity, and
// the device-plugin shim, where the kubelet counts each resource on its own.
// MIG profiles keep no seats in it, nor do sized ones: a seat without
// consumable capacity cannot carry the size its claim asks, and equal
// seats would hand claims a size they did not ask for.
//
// Profiles are served largest first; each takes whole groups, in pack
// order, until it holds about an equal share of the GPUs not yet taken
// (at least one group), always leaving room for one group of every smaller
// profile; the smallest takes what is left. A profile's gpus list in the
// config restricts its groups and so decides the layout.
func (p *Plan) ExclusiveLayout() (*Plan, string) {
	out := &Plan{GPUs: p.GPUs, Policy: p.Policy, Attributes: p.Attributes, HideBlocked: p.HideBlocked, Warnings: slices.Clone(p.Warnings), links: p.links}
	var exclusive []*Profile
	var sized []string
	copies := map[*Profile]*Profile{}
	for _, prof := range p.Profiles {
		c := *prof
		c.Groups = nil
		copies[prof] = &c
		out.Profiles = append(out.Profiles, &c)
		// A MIG profile's instances exclude each other and the groups on
		// their GPUs through counters only: without them it has no seats.
		if prof.MIG != nil {
			continue
		}
		if prof.Sizes != nil {
			if len(prof.Groups) > 0 {
				sized = append(sized, prof.Name)
				out.Warnings = append(out.Warnings, fmt.Sprintf("profile %s is sized and has no seats in the exclusive layout: a seat without consumable capacity cannot carry a size", prof.Name))
			}
			continue
		}
		if prof.AllowOverprovision {
			for _, g := range prof.Groups {
				gc := *g
				gc.Profile = &c
				c.Groups = append(c.Groups, &gc)
			}
			continue
		}
		exclusive = append(exclusive, prof)
	}
	slices.SortStableFunc(exclusive, func(a, b *Profile) int { return b.Size - a.Size })

	claimed := map[int]bool{}
	var parts []string
	for i, prof := range exclusive {
		free := p.GPUs - len(claimed)
		later := exclusive[i+1:]
		// Leave room for one group of every smaller profile, so that no
		// profile is starved by a larger one where the GPUs allow both.
		reserve := 0
		for _, q := range later {
			if len(q.Groups) > 0 {
				reserve += q.Size
			}
		}
		quota := free
		if len(later) > 0 {
			quota = free / (len(later) + 1)
		}
		c := copies[prof]
		taken := 0
		for _, g := range p.packOrder(prof) {
			if taken >= quota && len(c.Groups) > 0 {
				break
			}
			if slices.ContainsFunc(g.GPUs, func(x int) bool { return claimed[x] }) {
				continue
			}
			if free-taken-len(g.GPUs) < reserve {
				continue
			}
			gc := *g
			gc.Profile = c
			c.Groups = append(c.Groups, &gc)
			taken += len(g.GPUs)
			for _, x := range g.GPUs {
				claimed[x] = true
			}
		}
		slices.SortFunc(c.Groups, func(a, b *Group) int { return slices.Compare(a.GPUs, b.GPUs) })
		if len(c.Groups) == 0 {
			parts = append(parts, fmt.Sprintf("%s gets no GPUs", prof.Name))
			out.Warnings = append(out.Warnings, fmt.Sprintf("profile %s has no groups in the exclusive layout: larger profiles took its GPUs; set profiles[].gpus to share them out", prof.Name))
			continue
		}
		names := make([]string, len(c.Groups))
		for k, g := range c.Groups {
			names[k] = g.Name
		}
		parts = append(parts, fmt.Sprintf("%s gets %s", prof.Name, strings.Join(names, " ")))
	}
	reason := "no GPU serves two profiles that exclude each other: " + strings.Join(parts, "; ") +
		" (largest profile first, each about an equal share of the GPUs; set profiles[].gpus to choose)"
	if len(sized) > 0 {
		reason += "; sized profile(s) " + strings.Join(sized, ", ") + " get no seats: a seat without consumable capacity cannot carry the size its claim asks"
	}
	return out, reason
}
