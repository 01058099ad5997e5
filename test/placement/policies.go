package placement

import (
	"context"
	"fmt"
	"slices"
)

// Placement is where a request runs.
type Placement struct {
	Node *Node
	GPUs []int
	// Aligned says the GPUs form one of the node's topology groups of
	// that size (same NVLink island, PCIe switch, ...).
	Aligned bool
	// release undoes what the policy recorded beyond the node's GPUs.
	release func() error
}

// Policy places requests on the nodes it was built over.
type Policy interface {
	Name() string
	// Place returns where r runs, or nil when it fits nowhere.
	Place(ctx context.Context, r Request) (*Placement, error)
	// Batch is the window in which requests are gathered and placed
	// largest first (0: each on arrival).
	Batch() float64
}

// ClassicPolicies are the policies of the seed design, by name.
var ClassicPolicies = []string{"first-fit", "best-fit", "worst-fit", "bin-packing", "spread", "topology-aware"}

// classic places on the GPU model: a node chooser and, except for the
// topology-aware policy, the lowest free GPU indices on it, as a device
// plugin counting GPUs does.
type classic struct {
	name  string
	nodes []*Node
	// better says whether node a is a better choice than b for k GPUs.
	better func(a, b *Node, k int) bool
	batch  float64
}

// NewClassic returns the named classic policy over nodes. Bin-packing
// gathers requests for batchWindow and places them largest first, as the
// seed's algorithm sorts its requests.
func NewClassic(name string, nodes []*Node, batchWindow float64) (Policy, error) {
	used := func(n *Node) int { return n.GPUs() - n.Free() }
	p := &classic{name: name, nodes: nodes}
	switch name {
	case "first-fit":
		p.better = func(a, b *Node, k int) bool { return false }
	case "best-fit":
		p.better = func(a, b *Node, k int) bool { return a.Free()-k < b.Free()-k }
	case "worst-fit":
		p.better = func(a, b *Node, k int) bool { return a.Free() > b.Free() }
	case "bin-packing":
		p.better = func(a, b *Node, k int) bool {
			return used(a)*b.GPUs() > used(b)*a.GPUs() || a.Free() < b.Free() && used(a) == used(b)
		}
		p.batch = batchWindow
	case "spread":
		p.better = func(a, b *Node, k int) bool { return used(a)*b.GPUs() < used(b)*a.GPUs() }
	case "topology-aware":
		return &topologyAware{nodes: nodes}, nil
	default:
		return nil, fmt.Errorf("unknown policy %q", name)
	}
	return p, nil
}

func (p *classic) Name() string   { return p.name }
func (p *classic) Batch() float64 { return p.batch }

func (p *classic) Place(_ context.Context, r Request) (*Placement, error) {
	var best *Node
	for _, n := range p.nodes {
		if n.Free() < r.Size {
			continue
		}
		if best == nil || p.better(n, best, r.Size) {
			best = n
		}
	}
	if best == nil {
		return nil, nil
	}
	var gpus []int
	for i, f := range best.free {
		if f && len(gpus) < r.Size {
			gpus = append(gpus, i)
		}
	}
	return &Placement{Node: best, GPUs: gpus, Aligned: aligned(best, gpus)}, nil
}

// aligned says whether gpus are one of the node's groups of their size.
func aligned(n *Node, gpus []int) bool {
	if len(gpus) == 1 {
		return true
	}
	return slices.ContainsFunc(n.Groups[len(gpus)], func(g []int) bool { return slices.Equal(g, gpus) })
}

// topologyAware places only on whole topology groups, choosing the group
// that breaks the fewest free larger groups, then the node with the fewest
// free GPUs (best fit): it keeps islands whole for the requests that need
// them.
type topologyAware struct{ nodes []*Node }

func (p *topologyAware) Name() string   { return "topology-aware" }
func (p *topologyAware) Batch() float64 { return 0 }

func (p *topologyAware) Place(_ context.Context, r Request) (*Placement, error) {
	type cand struct {
		n      *Node
		g      []int
		broken int
	}
	var best *cand
	for _, n := range p.nodes {
		for _, g := range n.freeGroups(r.Size) {
			c := cand{n: n, g: g, broken: brokenLarger(n, g)}
			if best == nil || c.broken < best.broken || c.broken == best.broken && n.Free() < best.n.Free() {
				best = &c
			}
		}
	}
	if best == nil {
		return nil, nil
	}
	return &Placement{Node: best.n, GPUs: slices.Clone(best.g), Aligned: true}, nil
}

// brokenLarger counts the node's free groups larger than g that taking g
// would break.
func brokenLarger(n *Node, g []int) int {
	c := 0
	for size := range n.Groups {
		if size <= len(g) {
			continue
		}
		for _, big := range n.freeGroups(size) {
			if slices.ContainsFunc(g, func(x int) bool { return slices.Contains(big, x) }) {
				c++
			}
		}
	}
	return c
}
