package deviceplugin

import (
	"context"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// GetPreferredAllocation picks, for each container request, which of the
// available seats the kubelet should allocate: seats of one group where the
// request fits one group, on the group the policy prefers.
//
// The kubelet calls it on every allocation, with the NUMA-aligned seats
// plus those already chosen (mustInclude), and keeps only the answer's IDs
// that are available, filling any shortfall itself. An error here rejects
// the pod (UnexpectedAdmissionError), so it never returns one: unknown,
// duplicate or unavailable IDs are ignored, and an impossible request gets
// what can be had (possibly nothing).
//
// Groups are fixed at start, so choosing is a pass over the available IDs
// and one over the groups (plus a sort of the groups where a request spans
// several), never a search over subsets.
func (r *resource) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{ContainerResponses: make([]*pluginapi.ContainerPreferredAllocationResponse, len(req.ContainerRequests))}
	for i, creq := range req.ContainerRequests {
		ids := r.prefer(creq.AvailableDeviceIDs, creq.MustIncludeDeviceIDs, int(creq.AllocationSize))
		resp.ContainerResponses[i] = &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids}
		r.logger.V(4).Info("Preferred allocation", "size", creq.AllocationSize, "available", len(creq.AvailableDeviceIDs), "mustInclude", creq.MustIncludeDeviceIDs, "preferred", ids)
	}
	return resp, nil
}

// prefer chooses size seats of available:
//
//  1. the must-include seats (chosen already, from init containers or by
//     NUMA alignment), then the free seats of their groups, so that a
//     request stays on the groups it started on;
//  2. the rest on one group, if one has enough free seats: with policy
//     pack the group already in use with the fewest free seats (fill
//     groups before opening new ones), with policy spread the group with
//     the most free seats (the emptiest);
//  3. otherwise across groups, most free seats first, so the request
//     touches as few groups (and GPUs) as it can.
//
// Ties go to the planner's order for the policy (pack: small groups inside
// one larger group are adjacent; spread: each next group far from the
// ones before), and seats within a group go lowest first.
func (r *resource) prefer(available, mustInclude []string, size int) []string {
	if size <= 0 || len(r.ids) == 0 {
		return nil
	}
	c := r.newChoice(available, size)
	c.takeMustInclude(mustInclude)
	if !c.full() && !c.takeOneGroup() {
		c.takeAcrossGroups()
	}
	return c.out
}

// newChoice starts a choice of size seats among available.
func (r *resource) newChoice(available []string, size int) *choice {
	spg := r.profile.SeatsPerGroup
	c := &choice{r: r, avail: make([]bool, len(r.ids)), free: make([]int, len(r.groups)), inUse: make([]bool, len(r.groups)),
		out: make([]string, 0, min(size, len(r.ids))), size: size}
	for _, id := range available {
		if ref, ok := r.seats[id]; ok && !c.avail[ref.idx] {
			c.avail[ref.idx] = true
			c.free[ref.group]++
		}
	}
	for g := range c.free {
		// A seat missing from available is held by a pod (or not NUMA
		// aligned for this one, which the kubelet decides per group).
		c.inUse[g] = c.free[g] < spg
	}
	return c
}

// takeMustInclude is step 1: the must-include seats that are available,
// then the free seats of their groups.
func (c *choice) takeMustInclude(mustInclude []string) {
	spg := c.r.profile.SeatsPerGroup
	var must []int
	for _, id := range mustInclude {
		if ref, ok := c.r.seats[id]; ok && c.avail[ref.idx] {
			must = append(must, ref.idx)
		}
	}
	slices.Sort(must)
	must = slices.Compact(must)
	pinned := make([]bool, len(c.r.groups))
	for _, idx := range must {
		if c.full() {
			break
		}
		c.add(idx)
		pinned[idx/spg] = true
	}
	for g := range c.r.groups {
		if pinned[g] {
			c.takeFrom(g)
		}
	}
}

// takeOneGroup is step 2: the rest on the one group the policy prefers
// among those with enough free seats. It reports whether one had.
func (c *choice) takeOneGroup() bool {
	need := c.size - len(c.out)
	best := -1
	for g := range c.r.groups {
		if c.free[g] >= need && (best < 0 || c.r.before(g, best, c.free, c.inUse)) {
			best = g
		}
	}
	if best < 0 {
		return false
	}
	c.takeFrom(best)
	return true
}

// takeAcrossGroups is step 3: the rest across groups, most free seats
// first, ties to the policy.
func (c *choice) takeAcrossGroups() {
	var spill []int
	for g := range c.r.groups {
		if c.free[g] > 0 {
			spill = append(spill, g)
		}
	}
	slices.SortFunc(spill, func(a, b int) int {
		switch {
		case c.free[a] != c.free[b]:
			return c.free[b] - c.free[a]
		case c.r.before(a, b, c.free, c.inUse):
			return -1
		case c.r.before(b, a, c.free, c.inUse):
			return 1
		}
		return 0
	})
	for _, g := range spill {
		if c.full() {
			break
		}
		c.takeFrom(g)
	}
}

// before reports whether the policy prefers group a to group b for the
// rest of a request.
func (r *resource) before(a, b int, free []int, inUse []bool) bool {
	if r.policy == v1alpha1.PolicySpread {
		if free[a] != free[b] {
			return free[a] > free[b]
		}
		return a < b
	}
	if inUse[a] != inUse[b] {
		return inUse[a]
	}
	if free[a] != free[b] {
		return free[a] < free[b]
	}
	return a < b
}

// choice is a preferred allocation being built: which seats are still
// available, how many each group has free, which groups a pod holds seats
// of, and the seats chosen so far.
type choice struct {
	r     *resource
	avail []bool
	free  []int
	inUse []bool
	out   []string
	size  int
}

func (c *choice) full() bool { return len(c.out) >= c.size }

func (c *choice) add(idx int) {
	c.out = append(c.out, c.r.ids[idx])
	c.avail[idx] = false
	c.free[idx/c.r.profile.SeatsPerGroup]--
}

// takeFrom adds group g's free seats, lowest first, until the choice is full.
func (c *choice) takeFrom(g int) {
	spg := c.r.profile.SeatsPerGroup
	for idx := g * spg; idx < (g+1)*spg && !c.full(); idx++ {
		if c.avail[idx] {
			c.add(idx)
		}
	}
}
