package placement

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/fragmentation"
)

// The cluster's fragmentation, as kyb-scheduler's metrics report it: per
// node, the free GPUs and those outside every free group of the node's
// largest size (package fragmentation, the definition kubectl kyb seats
// shares), under the scheduler's own view of the allocations, in-flight
// ones included.
//
// It is measured when /metrics is scraped, not in a scheduling cycle: a
// cycle's work is what the pod needs, and the fragmentation of every node
// is none of it. A scrape reads what the score reads (the slice tracker's
// slices, the pools parsed from them, which the next cycle reuses, and the
// claim tracker's allocated state) and costs the scrape's goroutine a
// pass over the cluster's allocations, once per scrape interval
// (BenchmarkFragmentation); the cycle's cost is unchanged. The figures are
// as fresh as the scrape, where a period of our own would add its age.

// Fragmentation is each node's fragmentation, by node name, and the
// cluster's, under the scheduler's allocated state.
func (pl *Plugin) Fragmentation(ctx context.Context) (map[string]fragmentation.Measure, fragmentation.Measure, error) {
	var cluster fragmentation.Measure
	listed, err := pl.dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil, cluster, fmt.Errorf("list ResourceSlices: %w", err)
	}
	set := pl.pools.update(ctx, listed)
	state, err := pl.gatherAllocatedState()
	if err != nil {
		return nil, cluster, err
	}
	var v poolView
	v.gather(set, state)
	nodes := make(map[string]fragmentation.Measure, len(set.list))
	for k, p := range set.list {
		m := p.fragmentation(v.inUse[set.base[k]:set.base[k+1]])
		nodes[p.node] = m
		cluster.Add(m)
	}
	return nodes, cluster, nil
}

// fragmentation measures the pool with its devices in use as inUse says.
// A device holds its GPUs where it consumes their counters, whole or in
// part (a MIG instance); it takes them whole where it consumes all of
// each. A device of an overprovisioning profile consumes none: the
// allocator still hands out the groups over its GPUs, which stay free. A
// pool whose devices consume no GPU counter (the per-seat layout, whose
// groups that exclude each other never overlap) holds the GPUs its
// devices name.
func (p *pool) fragmentation(inUse []bool) fragmentation.Measure {
	counted := false
	for _, d := range p.devices {
		counted = counted || d.exclusive
	}
	groups := make([]fragmentation.Group, len(p.devices))
	var busy []int
	for i, d := range p.devices {
		var gpus []int
		d.gpus.each(func(i int) { gpus = append(gpus, i) })
		groups[i] = fragmentation.Group{GPUs: gpus, Whole: !counted || (d.exclusive && !d.partial), Unhealthy: d.tainted}
		if inUse[i] && (!counted || d.exclusive) {
			busy = append(busy, gpus...)
		}
	}
	return fragmentation.Of(groups, busy)
}

// fragmentationCollector reports the fragmentation measured through a
// plugin when scraped: nothing until the scheduler has made one.
type fragmentationCollector struct {
	metrics.BaseStableCollector

	nodeFree, nodeFragmented, nodeLargest *metrics.Desc
	free, fragmented                      *metrics.Desc

	mu     sync.Mutex
	pl     *Plugin
	logger klog.Logger
}

var _ metrics.StableCollector = &fragmentationCollector{}

func newFragmentationCollector() *fragmentationCollector {
	desc := func(name, help string, labels ...string) *metrics.Desc {
		return metrics.NewDesc("kyb_placement_"+name, help, labels, nil, metrics.ALPHA, "")
	}
	return &fragmentationCollector{
		nodeFree: desc("free_gpus",
			"GPUs of the node that no allocation holds, in flight included, and that a healthy group covers.", "node"),
		nodeFragmented: desc("fragmented_gpus",
			"Free GPUs of the node outside every free group of its largest size: what a request of that size cannot use.", "node"),
		nodeLargest: desc("largest_group_gpus",
			"GPUs of the node's largest healthy group that takes whole GPUs, which fragmented_gpus is measured against.", "node"),
		free: desc("cluster_free_gpus",
			"Free GPUs of all nodes (the sum of kyb_placement_free_gpus)."),
		fragmented: desc("cluster_fragmented_gpus",
			"Fragmented GPUs of all nodes, each against its own largest group (the sum of kyb_placement_fragmented_gpus)."),
	}
}

// measureFrom has m's fragmentation measured through pl from now on; a
// nil Metrics measures nothing.
func (m *Metrics) measureFrom(logger klog.Logger, pl *Plugin) {
	if m == nil {
		return
	}
	c := m.fragmentation
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pl, c.logger = pl, logger
}

// DescribeWithStability sends the metrics' descriptions.
func (c *fragmentationCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{c.nodeFree, c.nodeFragmented, c.nodeLargest, c.free, c.fragmented} {
		ch <- d
	}
}

// CollectWithStability measures the fragmentation and sends it.
func (c *fragmentationCollector) CollectWithStability(ch chan<- metrics.Metric) {
	c.mu.Lock()
	pl, logger := c.pl, c.logger
	c.mu.Unlock()
	if pl == nil {
		return
	}
	nodes, cluster, err := pl.Fragmentation(klog.NewContext(context.Background(), logger))
	if err != nil {
		logger.Error(err, "Measuring the fragmentation for /metrics")
		return
	}
	for node, m := range nodes {
		ch <- metrics.NewLazyConstMetric(c.nodeFree, metrics.GaugeValue, float64(m.Free), node)
		ch <- metrics.NewLazyConstMetric(c.nodeFragmented, metrics.GaugeValue, float64(m.Fragmented), node)
		ch <- metrics.NewLazyConstMetric(c.nodeLargest, metrics.GaugeValue, float64(m.Largest), node)
	}
	ch <- metrics.NewLazyConstMetric(c.free, metrics.GaugeValue, float64(cluster.Free))
	ch <- metrics.NewLazyConstMetric(c.fragmented, metrics.GaugeValue, float64(cluster.Fragmented))
}
