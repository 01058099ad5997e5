package draplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// heldPublishDelay gathers the changes of the groups in use into one
// publish. Until it, the scheduler sees groups that cannot take a claim,
// which it refuses; a released group waits as long to be offered again.
const heldPublishDelay = 500 * time.Millisecond

// watchChanges publishes the slices, then again whenever the set of
// unhealthy GPUs changes, so that taints appear and go, and whenever the
// groups in use change, so that blocked groups go and come back. It
// records an event on the Node for every GPU that changes health, starting
// from "all healthy", so GPUs already unhealthy at start get theirs too.
func (p *publisher) watchChanges(ctx context.Context, to slicePublisher, healthChanged <-chan struct{}) {
	logger := klog.FromContext(ctx)
	last := map[int]health.Fault{}
	lastInstances := map[health.Instance]health.Fault{}
	for {
		now, nowInstances := p.health.faults(), p.health.view.InstanceFaults()
		p.healthEvents(ctx, last, now)
		p.instanceHealthEvents(ctx, lastInstances, nowInstances)
		if ctx.Err() != nil {
			return
		}
		if err := p.publish(ctx, to); err != nil {
			logger.Error(err, "Cannot publish the ResourceSlices again")
		}
		last, lastInstances = now, nowInstances
		select {
		case <-ctx.Done():
			return
		case <-healthChanged:
		case <-p.heldCh:
			// Prepares and unprepares come in bursts (a node starting or
			// draining pods): one publish for the burst, not one per
			// batch. Health changes below publish at once.
			select {
			case <-ctx.Done():
				return
			case <-healthChanged:
			case <-p.clock.After(heldPublishDelay):
			}
		}
	}
}

// healthEvents records an event for every GPU whose fault appeared,
// changed or went away between two views.
func (p *publisher) healthEvents(ctx context.Context, before, after map[int]health.Fault) {
	gpus := map[int]bool{}
	for x := range before {
		gpus[x] = true
	}
	for x := range after {
		gpus[x] = true
	}
	for _, x := range slices.Sorted(maps.Keys(gpus)) {
		was, wasBad := before[x]
		is, isBad := after[x]
		uuid := p.node.Inv.GPUs[x].UUID
		groups := strings.Join(p.groupsOf(x), " ")
		switch {
		case isBad && (!wasBad || was.Reason != is.Reason):
			taint, _ := draresources.GroupTaint([]int{x}, taintsOf(map[int]health.Fault{x: is}, p.health.lostEffect))
			note := fmt.Sprintf("GPU %d (%s) is unhealthy: %s. Its groups %s are tainted %s=%s:%s", x, uuid, is.Message, groups, taint.Key, taint.Value, taint.Effect)
			if is.Permanent() {
				note += "; a lost GPU stays unhealthy until it is reset and the plugin restarted"
			}
			p.events.Warning(ctx, nodeevents.ReasonGPUUnhealthy, note)
		case wasBad && !isBad:
			p.events.Normal(ctx, nodeevents.ReasonGPUHealthy, fmt.Sprintf("GPU %d (%s) is healthy again after %s; the taint is removed from its groups %s", x, uuid, was.Reason, groups))
		}
	}
}

// groupsOf names the groups that contain GPU x, in the plan's order.
func (p *publisher) groupsOf(x int) []string {
	var out []string
	for _, g := range p.node.Plan.Ordered() {
		if slices.Contains(g.GPUs, x) {
			out = append(out, g.Name)
		}
	}
	return out
}
