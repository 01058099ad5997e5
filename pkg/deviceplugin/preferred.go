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
	spg := r.profile.SeatsPerGroup
	avail := make([]bool, len(r.ids))
	free := make([]int, len(r.groups))
	for _, id := range available {
		if ref, ok := r.seats[id]; ok && !avail[ref.idx] {
			avail[ref.idx] = true
			free[ref.group]++
		}
	}
	inUse := make([]bool, len(r.groups))
	for g := range free {
		// A seat missing from available is held by a pod (or not NUMA
		// aligned for this one, which the kubelet decides per group).
		inUse[g] = free[g] < spg
	}
	c := choice{r: r, avail: avail, free: free, out: make([]string, 0, min(size, len(r.ids))), size: size}

	var must []int
	for _, id := range mustInclude {
		if ref, ok := r.seats[id]; ok && avail[ref.idx] {
			must = append(must, ref.idx)
		}
	}
	slices.Sort(must)
	must = slices.Compact(must)
	pinned := make([]bool, len(r.groups))
	for _, idx := range must {
		if c.full() {
			break
		}
		c.add(idx)
		pinned[idx/spg] = true
	}
	for g := range r.groups {
		if pinned[g] {
			c.takeFrom(g)
		}
	}
	if c.full() {
		return c.out
	}

	need := size - len(c.out)
	best := -1
	for g := range r.groups {
		if free[g] >= need && (best < 0 || r.before(g, best, free, inUse)) {
			best = g
		}
	}
	if best >= 0 {
		c.takeFrom(best)
		return c.out
	}

	var spill []int
	for g := range r.groups {
		if free[g] > 0 {
			spill = append(spill, g)
		}
	}
	slices.SortFunc(spill, func(a, b int) int {
		switch {
		case free[a] != free[b]:
			return free[b] - free[a]
		case r.before(a, b, free, inUse):
			return -1
		case r.before(b, a, free, inUse):
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
	return c.out
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

// choice is a preferred allocation being built.
type choice struct {
	r     *resource
	avail []bool
	free  []int
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
