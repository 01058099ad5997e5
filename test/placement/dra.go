package placement

import (
	"context"
	"fmt"
	"math/rand/v2"

	resourceapi "k8s.io/api/resource/v1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// draPolicy places with the scheduler's real DRA allocator over the
// ResourceSlices the plugin publishes, in the given device order. As
// kube-scheduler does, it filters every node (one allocator per request,
// Allocate per node) and picks one of the nodes that fit; with no score
// telling them apart, the scheduler picks at random among equals, and so
// does this policy (seeded). The allocator picks the device: the first
// that fits in the published order.
type draPolicy struct {
	order   v1alpha1.AllocationPolicy
	nodes   []*Node
	cluster *schedulertest.Cluster
	classes map[int]string
	rand    *rand.Rand
	n       int
}

// DRAPolicies are the policies placing with the real allocator.
var DRAPolicies = []string{"dra-pack", "dra-spread"}

// NewDRA returns the DRA policy with device order "pack" or "spread".
func NewDRA(order v1alpha1.AllocationPolicy, nodes []*Node, seed uint64) (Policy, error) {
	p := &draPolicy{order: order, nodes: nodes, cluster: schedulertest.New(schedulertest.SchedulerFeatures()), classes: map[int]string{},
		rand: rand.New(rand.NewPCG(seed, 7))}
	for _, n := range nodes {
		plan, ok := n.plans[order]
		if !ok {
			return nil, fmt.Errorf("node %s has no %s plan", n.Name, order)
		}
		p.cluster.AddNode(n.Name, draresources.Resources(plan, n.inv, n.Name, draresources.LayoutShared), driver.Name)
		// Every node's classes have the same names; a later node adds
		// the profiles an earlier one could not form.
		p.cluster.AddClasses(draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{})...)
		for _, prof := range plan.Profiles {
			p.classes[prof.Size] = draresources.DeviceClassName(prof.Resource)
		}
	}
	return p, nil
}

func (p *draPolicy) Name() string   { return "dra-" + string(p.order) }
func (p *draPolicy) Batch() float64 { return 0 }

func (p *draPolicy) Place(ctx context.Context, r Request) (*Placement, error) {
	class, ok := p.classes[r.Size]
	if !ok {
		return nil, fmt.Errorf("no profile of %d GPUs", r.Size)
	}
	p.n++
	claim := schedulertest.Claim(fmt.Sprintf("r%d", r.ID), class, 1)
	a, err := p.cluster.Allocator(ctx)
	if err != nil {
		return nil, err
	}
	type fit struct {
		n   *Node
		res *resourceapi.AllocationResult
	}
	var fits []fit
	for _, n := range p.nodes {
		res, err := p.cluster.Try(ctx, a, claim, n.Name)
		if err != nil {
			return nil, fmt.Errorf("allocate on %s: %w", n.Name, err)
		}
		if res != nil {
			fits = append(fits, fit{n, res})
		}
	}
	if len(fits) == 0 {
		return nil, nil
	}
	f := fits[p.rand.IntN(len(fits))]
	p.cluster.Record(f.res)
	dev := f.res.Devices.Results[0].Device
	g := f.n.plans[p.order].GroupByDevice(dev)
	if g == nil {
		return nil, fmt.Errorf("node %s: the allocator chose %s, which the plan does not know", f.n.Name, dev)
	}
	return &Placement{Node: f.n, GPUs: g.GPUs, Aligned: true, release: func() error { p.cluster.Release(f.res); return nil }}, nil
}
