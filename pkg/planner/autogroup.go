package planner

import (
	"slices"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// searchBudget bounds the partition search (group placements tried). Every
// node of up to 8 GPUs is searched exhaustively far below it (8 GPUs into
// pairs: 105 partitions); on larger nodes the search starts from the best
// candidates and keeps the best partition found within the budget, so the
// result stays deterministic.
const searchBudget = 200_000

// autoGroups partitions gpus into floor(len/size) disjoint groups of size
// GPUs. Partitions are compared by the weakest links of their groups,
// worst first (so an all-NVLink partition beats any other), then by the sum
// of all pair scores inside groups; among equals the first one found wins
// (candidates are tried best first, lowest indices first on ties).
func autoGroups(inv *inventory.Inventory, gpus []int, size int) [][]int {
	if size <= 0 || len(gpus) < size {
		return nil
	}
	if size == 1 {
		out := make([][]int, len(gpus))
		for i, g := range gpus {
			out[i] = []int{g}
		}
		return out
	}
	s := &search{inv: inv, size: size, groups: len(gpus) / size, budget: searchBudget}
	s.skips = len(gpus) - s.groups*size
	s.run(slices.Clone(gpus), nil, 0)
	return s.best
}

type search struct {
	inv    *inventory.Inventory
	size   int
	groups int
	skips  int
	budget int

	best      [][]int
	bestQual  []inventory.Link // ascending: worst group first
	bestScore int
}

// run places groups on the remaining GPUs. The lowest remaining GPU either
// anchors a group with size-1 others, or (while skips remain) is left out.
func (s *search) run(remaining []int, chosen [][]int, skipped int) {
	if s.budget <= 0 {
		return
	}
	if len(chosen) == s.groups {
		s.consider(chosen)
		return
	}
	if len(remaining) < s.size {
		return
	}
	if s.best != nil && s.prune(chosen) {
		return
	}
	anchor, rest := remaining[0], remaining[1:]
	for _, c := range s.candidates(anchor, rest) {
		s.budget--
		if s.budget <= 0 {
			return
		}
		group := append([]int{anchor}, c...)
		s.run(without(rest, c), append(chosen, group), skipped)
	}
	if skipped < s.skips {
		s.run(rest, chosen, skipped+1)
	}
}

// candidates returns every choice of size-1 partners for anchor, best
// first, so that a good partition is found early and prunes the rest.
func (s *search) candidates(anchor int, rest []int) [][]int {
	var out [][]int
	combos(rest, s.size-1, func(c []int) {
		out = append(out, slices.Clone(c))
	})
	type scored struct {
		c    []int
		q    inventory.Link
		sum  int
		rank int
	}
	sc := make([]scored, len(out))
	for i, c := range out {
		g := append([]int{anchor}, c...)
		sc[i] = scored{c: c, q: weakest(s.inv, g), sum: pairSum(s.inv, g), rank: i}
	}
	slices.SortStableFunc(sc, func(a, b scored) int {
		switch {
		case inventory.Better(a.q, b.q):
			return -1
		case inventory.Better(b.q, a.q):
			return 1
		case a.sum != b.sum:
			return b.sum - a.sum
		default:
			return a.rank - b.rank
		}
	})
	for i := range sc {
		out[i] = sc[i].c
	}
	return out
}

// prune reports whether the partial partition can no longer beat the best:
// its worst group so far bounds its final worst group from above.
func (s *search) prune(chosen [][]int) bool {
	if len(chosen) == 0 {
		return false
	}
	worst := weakest(s.inv, chosen[0])
	for _, g := range chosen[1:] {
		if q := weakest(s.inv, g); inventory.Better(worst, q) {
			worst = q
		}
	}
	return inventory.Better(s.bestQual[0], worst)
}

func (s *search) consider(chosen [][]int) {
	qual := make([]inventory.Link, len(chosen))
	score := 0
	for i, g := range chosen {
		qual[i] = weakest(s.inv, g)
		score += pairSum(s.inv, g)
	}
	slices.SortStableFunc(qual, func(a, b inventory.Link) int {
		switch {
		case inventory.Better(a, b):
			return 1
		case inventory.Better(b, a):
			return -1
		}
		return 0
	})
	if s.best != nil {
		for i := range qual {
			if inventory.Better(s.bestQual[i], qual[i]) {
				return
			}
			if inventory.Better(qual[i], s.bestQual[i]) {
				s.take(chosen, qual, score)
				return
			}
		}
		if score <= s.bestScore {
			return
		}
	}
	s.take(chosen, qual, score)
}

func (s *search) take(chosen [][]int, qual []inventory.Link, score int) {
	s.best = make([][]int, len(chosen))
	for i, g := range chosen {
		s.best[i] = slices.Sorted(slices.Values(g))
	}
	slices.SortFunc(s.best, slices.Compare)
	s.bestQual, s.bestScore = qual, score
}

func pairSum(inv *inventory.Inventory, gpus []int) int {
	sum := 0
	for i := 0; i < len(gpus); i++ {
		for j := i + 1; j < len(gpus); j++ {
			sum += inv.Link(gpus[i], gpus[j]).Score()
		}
	}
	return sum
}

// combos calls fn with every k-subset of xs, in lexicographic order. fn
// must not keep the slice.
func combos(xs []int, k int, fn func([]int)) {
	buf := make([]int, 0, k)
	var rec func(start int)
	rec = func(start int) {
		if len(buf) == k {
			fn(buf)
			return
		}
		for i := start; i <= len(xs)-(k-len(buf)); i++ {
			buf = append(buf, xs[i])
			rec(i + 1)
			buf = buf[:len(buf)-1]
		}
	}
	rec(0)
}

func without(xs, drop []int) []int {
	out := make([]int, 0, len(xs)-len(drop))
	for _, x := range xs {
		if !slices.Contains(drop, x) {
			out = append(out, x)
		}
	}
	return out
}
