package seatview

// Pools as the scheduler sees them.
//
// A driver republishes a pool by writing its slices under a higher
// generation (spec.pool.generation) and deleting the older ones after;
// meanwhile both generations are listed. The scheduler's allocator
// (GatherPools in k8s.io/dynamic-resource-allocation/structured) keeps, per
// pool, the slices of its highest generation alone, and allocates from the
// pool only when all spec.pool.resourceSliceCount of them are there: an
// incomplete pool gives no device at all, and an older generation does not
// stand in for it. The view counts what the scheduler can hand out, so it
// does the same, and names the pools it leaves out for being incomplete.

import (
	"cmp"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// IncompletePool is a pool whose newest generation lacks slices: the
// driver is publishing it, or its slices are being deleted. The scheduler
// allocates none of its devices until every slice is there, and the view
// shows none of its groups.
type IncompletePool struct {
	Pool       string `json:"pool"`
	Generation int64  `json:"generation"`
	// Slices is how many slices of the generation are listed, of
	// ResourceSliceCount.
	Slices             int   `json:"slices"`
	ResourceSliceCount int64 `json:"resourceSliceCount"`
}

// gatherPools returns the slices of each pool's newest generation where
// that generation is complete, and the pools where it is not, by the node
// their slices name. Slices must be of one driver.
func gatherPools(resourceSlices []resourceapi.ResourceSlice) ([]resourceapi.ResourceSlice, map[string][]IncompletePool) {
	newest := map[string][]resourceapi.ResourceSlice{}
	var pools []string
	for _, s := range resourceSlices {
		name := s.Spec.Pool.Name
		have, seen := newest[name]
		switch {
		case !seen:
			pools = append(pools, name)
			newest[name] = []resourceapi.ResourceSlice{s}
		case s.Spec.Pool.Generation > have[0].Spec.Pool.Generation:
			newest[name] = []resourceapi.ResourceSlice{s}
		case s.Spec.Pool.Generation == have[0].Spec.Pool.Generation:
			newest[name] = append(have, s)
		}
	}
	var complete []resourceapi.ResourceSlice
	incomplete := map[string][]IncompletePool{}
	for _, name := range pools {
		ss := newest[name]
		// As the allocator: the count of the generation's first slice.
		if want := ss[0].Spec.Pool.ResourceSliceCount; int64(len(ss)) != want {
			if node := nodeOf(ss); node != "" {
				incomplete[node] = append(incomplete[node], IncompletePool{
					Pool: name, Generation: ss[0].Spec.Pool.Generation, Slices: len(ss), ResourceSliceCount: want,
				})
			}
			continue
		}
		complete = append(complete, ss...)
	}
	for _, p := range incomplete {
		slices.SortFunc(p, func(a, b IncompletePool) int { return cmp.Compare(a.Pool, b.Pool) })
	}
	return complete, incomplete
}

// nodeOf is the node a pool's slices name, "" if none does.
func nodeOf(ss []resourceapi.ResourceSlice) string {
	for _, s := range ss {
		if s.Spec.NodeName != nil {
			return *s.Spec.NodeName
		}
	}
	return ""
}
