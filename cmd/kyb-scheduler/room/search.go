package room

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// DefaultBudget bounds the allocator runs of one search: each asks the
// allocator whether a pod fits a node with some units released.
const DefaultBudget = 48

// Unit is what a search releases whole: one pod, or the pods of a gang.
type Unit struct {
	Pods []*v1.Pod
	// Priority is the unit's: the pod's, or the gang's.
	Priority int32
}

// Fit tells whether the pod fits the node with the given units released
// (indices into the search's units), and if so what the allocator gave
// its claims there. It is the judge: the search only proposes.
type Fit func(ctx context.Context, released []int) (allocation []resourceapi.AllocationResult, fits bool, err error)

// Search finds the fewest units whose release lets a pod's claims be
// allocated on a node: the fewest pods, then the lowest priorities, with
// the fewest PodDisruptionBudgets violated before either where
// Violations is set.
//
// Releasing every unit is where it starts: if the pod does not fit then,
// nothing helps. Otherwise the allocator's allocation, found with the
// units released, takes some of their devices: the units holding those
// (conflict) are a candidate, which the allocator checks with exactly
// them released. Each unit of a candidate is then kept in turn, and the
// allocator asked again without it, which finds the allocation that
// avoids that unit's devices (a four-GPU group elsewhere); and so on,
// depth first, within Budget allocator runs, an allocation met before
// not expanded again. Where the pod fits with a
// set S released, there is an allocation that takes nothing from the
// units outside S; keeping only units outside S, the search reaches it.
// Last, every unit of the best candidate is tried without (the most
// important first): one whose release does not help is not a victim.
type Search struct {
	units []Unit
	use   *usage
	// Violations counts the PodDisruptionBudgets that releasing units
	// would violate; nil counts none.
	Violations func(units []int) int
	// Budget bounds the allocator runs (DefaultBudget where 0); the
	// last pass over the best candidate is not counted.
	Budget int
	// Accept, where set, must also take a set of units the pod fits
	// without before it counts: a set it refuses is no candidate. It is
	// asked only about a set that would be the best so far, and about
	// each smaller set of the last pass.
	Accept func(ctx context.Context, units []int, allocation []resourceapi.AllocationResult) (bool, error)
}

// Result is what a search found.
type Result struct {
	// Victims are the units to release, by index, the most important
	// first.
	Victims []int
	// Allocation is what the allocator gave the pod's claims with them
	// released.
	Allocation []resourceapi.AllocationResult
	// Violations counts the PodDisruptionBudgets their release violates.
	Violations int
	// Fits counts the allocator runs.
	Fits int
}

// NewSearch prepares a search for room on node among units, given the
// cluster's allocated state (the scheduler's, with claims in flight) and
// its DRA state.
func NewSearch(dra fwk.SharedDRAManager, state *structured.AllocatedState, node string, units []Unit) (*Search, error) {
	slices, err := dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil, fmt.Errorf("list resource slices: %w", err)
	}
	return &Search{units: units, use: newUsage(dra, state, nodeInventory(slices, node), units)}, nil
}

// cost orders victim sets: fewest budgets violated, fewest pods, lowest
// highest priority, lowest sum of priorities.
type cost struct {
	violations int
	pods       int
	highest    int32
	sum        int64
}

func (a cost) compare(b cost) int {
	return cmp.Or(cmp.Compare(a.violations, b.violations), cmp.Compare(a.pods, b.pods),
		cmp.Compare(a.highest, b.highest), cmp.Compare(a.sum, b.sum))
}

func (s *Search) cost(units []int) cost {
	c := cost{highest: -1 << 31}
	for _, i := range units {
		u := s.units[i]
		c.pods += len(u.Pods)
		c.highest = max(c.highest, u.Priority)
		c.sum += int64(u.Priority) * int64(len(u.Pods))
	}
	if s.Violations != nil && len(units) > 0 {
		c.violations = s.Violations(units)
	}
	return c
}

// Run searches; nil where the pod does not fit even with every unit
// released, or where Accept takes no set it fits without.
func (s *Search) Run(ctx context.Context, fit Fit) (*Result, error) {
	logger := klog.FromContext(ctx)
	budget := cmp.Or(s.Budget, DefaultBudget)
	runs := 0
	try := func(released []int) ([]resourceapi.AllocationResult, bool, error) {
		runs++
		return fit(ctx, released)
	}
	all := make([]int, len(s.units))
	for i := range all {
		all[i] = i
	}
	alloc, ok, err := try(all)
	if err != nil || !ok {
		return nil, err
	}
	var best *Result
	var bestCost cost
	accepted := map[string]bool{}
	accept := func(victims []int, alloc []resourceapi.AllocationResult) (bool, error) {
		if s.Accept == nil {
			return true, nil
		}
		k := key(victims)
		if ok, seen := accepted[k]; seen {
			return ok, nil
		}
		ok, err := s.Accept(ctx, victims, alloc)
		accepted[k] = ok
		return ok, err
	}
	consider := func(victims []int, alloc []resourceapi.AllocationResult) error {
		c := s.cost(victims)
		if best != nil && c.compare(bestCost) >= 0 {
			return nil
		}
		if ok, err := accept(victims, alloc); err != nil || !ok {
			return err
		}
		best, bestCost = &Result{Victims: victims, Allocation: alloc, Violations: c.violations}, c
		return nil
	}
	if err := consider(all, alloc); err != nil {
		return nil, err
	}

	type frame struct {
		kept  []int
		alloc []resourceapi.AllocationResult
	}
	stack := []frame{{alloc: alloc}}
	seenKept := sets.New(key(nil))
	tried := sets.New(key(all))
	expanded := sets.New[string]()
	for len(stack) > 0 && runs < budget {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		released := without(all, f.kept)
		if f.alloc == nil {
			if f.alloc, ok, err = try(released); err != nil {
				return nil, err
			} else if !ok {
				continue
			}
		}
		allowed := sets.New(released...)
		hs := s.use.conflict(f.alloc, func(h int) bool {
			for _, u := range s.use.holdings[h].units {
				if !allowed.Has(u) {
					return false
				}
			}
			return true
		}, func(hs []int) cost { return s.cost(s.use.unitsOf(sets.New(hs...))) })
		candidate := s.use.unitsOf(hs)
		if k := key(candidate); !tried.Has(k) && runs < budget {
			tried.Insert(k)
			if a, ok, err := try(candidate); err != nil {
				return nil, err
			} else if ok {
				if err := consider(candidate, a); err != nil {
					return nil, err
				}
			} else {
				// The allocation's own devices were not all that kept the
				// pod out (another filter, or counters the model does
				// not see): the set it was found with fits.
				logger.V(5).Info("Victims of an allocation's devices are not enough; the search keeps the set it was found with", "candidate", candidate)
				candidate = released
			}
		}
		// Keep each unit of the candidate in turn, the least important
		// tried last, so first on the stack. An allocation met before was
		// expanded then: keeping its units again mostly finds the same.
		ak := allocationKey(f.alloc)
		if expanded.Has(ak) {
			continue
		}
		expanded.Insert(ak)
		byImportance := slices.Clone(candidate)
		slices.SortStableFunc(byImportance, func(a, b int) int { return s.cost([]int{a}).compare(s.cost([]int{b})) })
		for _, u := range byImportance {
			kept := append(slices.Clone(f.kept), u)
			slices.Sort(kept)
			if k := key(kept); !seenKept.Has(k) {
				seenKept.Insert(k)
				stack = append(stack, frame{kept: kept})
			}
		}
	}

	if best == nil {
		return nil, nil
	}
	// No victim whose release does not help: the most important first.
	victims := slices.Clone(best.Victims)
	slices.SortStableFunc(victims, func(a, b int) int { return s.cost([]int{b}).compare(s.cost([]int{a})) })
	for i := 0; i < len(victims); {
		rest := slices.Delete(slices.Clone(victims), i, i+1)
		a, ok, err := try(rest)
		if err != nil {
			return nil, err
		}
		if ok {
			if ok, err = accept(rest, a); err != nil {
				return nil, err
			}
		}
		if ok {
			victims, best.Allocation = rest, a
			continue
		}
		i++
	}
	best.Victims = victims
	best.Violations = s.cost(victims).violations
	best.Fits = runs
	return best, nil
}

func without(all, kept []int) []int {
	out := make([]int, 0, len(all))
	for _, i := range all {
		if !slices.Contains(kept, i) {
			out = append(out, i)
		}
	}
	return out
}

func key(units []int) string {
	s := slices.Clone(units)
	slices.Sort(s)
	var b strings.Builder
	for _, i := range s {
		fmt.Fprintf(&b, "%d,", i)
	}
	return b.String()
}

// allocationKey names the devices an allocation takes.
func allocationKey(alloc []resourceapi.AllocationResult) string {
	var ids []string
	for i := range alloc {
		for _, r := range alloc[i].Devices.Results {
			ids = append(ids, r.Driver+"/"+r.Pool+"/"+r.Device)
		}
	}
	slices.Sort(ids)
	return strings.Join(ids, ",")
}
