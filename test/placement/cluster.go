package placement

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// Node is one simulated node: its GPUs, which are free, and the groups its
// plan forms from the topology (the GPU sets a topology-aware placement
// uses).
type Node struct {
	Name   string
	Preset string
	free   []bool
	// Groups are the plan's groups by size, in the plan's order.
	Groups map[int][][]int
	// inv and plans are the node's inventory and its plans per device
	// order, for the DRA policies.
	inv   *inventory.Inventory
	plans map[v1alpha1.AllocationPolicy]*planner.Plan
}

// GPUs is the node's GPU count.
func (n *Node) GPUs() int { return len(n.free) }

// Free is the number of free GPUs.
func (n *Node) Free() int {
	c := 0
	for _, f := range n.free {
		if f {
			c++
		}
	}
	return c
}

func (n *Node) allFree(gpus []int) bool {
	for _, g := range gpus {
		if !n.free[g] {
			return false
		}
	}
	return true
}

// freeGroups are the node's groups of size k whose GPUs are all free.
func (n *Node) freeGroups(k int) [][]int {
	var out [][]int
	for _, g := range n.Groups[k] {
		if n.allFree(g) {
			out = append(out, g)
		}
	}
	return out
}

// stranded is how many free GPUs are in no fully free group of size k.
func (n *Node) stranded(k int) int {
	in := make([]bool, len(n.free))
	for _, g := range n.freeGroups(k) {
		for _, x := range g {
			in[x] = true
		}
	}
	c := 0
	for i, f := range n.free {
		if f && !in[i] {
			c++
		}
	}
	return c
}

func (n *Node) take(gpus []int) error {
	for _, g := range gpus {
		if !n.free[g] {
			return fmt.Errorf("node %s: GPU %d is already taken", n.Name, g)
		}
	}
	for _, g := range gpus {
		n.free[g] = false
	}
	return nil
}

func (n *Node) release(gpus []int) {
	for _, g := range gpus {
		n.free[g] = true
	}
}

// NodeSpec is a preset and how many nodes of it.
type NodeSpec struct {
	Preset string
	Count  int
}

// ParseNodes reads "dgx-h100:4,pcie-8gpu:4".
func ParseNodes(s string) ([]NodeSpec, error) {
	var out []NodeSpec
	for _, part := range strings.Split(s, ",") {
		preset, count, ok := strings.Cut(strings.TrimSpace(part), ":")
		n, err := strconv.Atoi(count)
		if !ok || err != nil || n < 1 {
			return nil, fmt.Errorf("nodes %q: %q is not <preset>:<count>", s, part)
		}
		out = append(out, NodeSpec{Preset: preset, Count: n})
	}
	return out, nil
}

// NewCluster builds the nodes, planning each with profiles of the given
// sizes (and 4, which fragmentation is measured against), one seat per
// group, in both device orders.
func NewCluster(ctx context.Context, specs []NodeSpec, sizes []int) ([]*Node, error) {
	sizes = slices.Clone(sizes)
	if !slices.Contains(sizes, 4) {
		sizes = append(sizes, 4)
	}
	slices.Sort(sizes)
	var nodes []*Node
	for _, spec := range specs {
		for i := 0; i < spec.Count; i++ {
			name := fmt.Sprintf("%s-%d", spec.Preset, i)
			n, err := newNode(ctx, name, spec.Preset, sizes)
			if err != nil {
				return nil, err
			}
			nodes = append(nodes, n)
		}
	}
	return nodes, nil
}

func newNode(ctx context.Context, name, preset string, sizes []int) (*Node, error) {
	sim, err := simnode.Load(preset, name)
	if err != nil {
		return nil, err
	}
	inv, err := inventory.Discover(ctx, sim.NVML(), sim.PCIe())
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	n := &Node{Name: name, Preset: preset, free: make([]bool, len(inv.GPUs)), Groups: map[int][][]int{}, inv: inv,
		plans: map[v1alpha1.AllocationPolicy]*planner.Plan{}}
	for i := range n.free {
		n.free[i] = true
	}
	for _, policy := range []v1alpha1.AllocationPolicy{v1alpha1.PolicyPack, v1alpha1.PolicySpread} {
		var cfg strings.Builder
		fmt.Fprintf(&cfg, "allocationPolicy: %s\nprofiles:\n", policy)
		for _, k := range sizes {
			if k <= len(inv.GPUs) {
				fmt.Fprintf(&cfg, "- {resource: kyb.ai/gpu-%dx-seat}\n", k)
			}
		}
		c, _, err := v1alpha1.LoadNodeConfig([]byte(cfg.String()), "simulator config")
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		plan, err := planner.New(inv, c)
		if err != nil {
			return nil, fmt.Errorf("node %s: plan: %w", name, err)
		}
		n.plans[policy] = plan
	}
	for _, g := range n.plans[v1alpha1.PolicyPack].Ordered() {
		n.Groups[len(g.GPUs)] = append(n.Groups[len(g.GPUs)], slices.Clone(g.GPUs))
	}
	return n, nil
}
