package draresources

import (
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// Node is what one node serves: its pool, its plan and inventory, and the
// index from every device name it may have published to its group, seat
// and MIG instance. The DRA plugin and each of its parts read it; nothing
// changes it once made.
type Node struct {
	Pool  string
	Plan  *planner.Plan
	Inv   *inventory.Inventory
	Index map[string]DeviceRef
}

// NewNode indexes plan for the node whose pool is pool.
func NewNode(pool string, plan *planner.Plan, inv *inventory.Inventory) Node {
	return Node{Pool: pool, Plan: plan, Inv: inv, Index: Index(plan)}
}

// Group is the group of a group device (g01-2x), nil where today's plan has
// none: the index's lookup, not the plan's walk over every group, on the
// prepare path.
func (n Node) Group(groupDevice string) *planner.Group {
	if ref, ok := n.Index[groupDevice]; ok && ref.Seat < 0 {
		return ref.Group
	}
	return nil
}
