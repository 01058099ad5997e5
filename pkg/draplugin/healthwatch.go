package draplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
)

// watchChanges republishes the ResourceSlices whenever the set of
// unhealthy GPUs changes, so that taints appear and go, and whenever the
// groups in use change, so that blocked groups go and come back. It
// records an event on the Node for every GPU that changes health, starting
// from "all healthy", so GPUs already unhealthy at start get theirs too.
func (d *Driver) watchChanges(ctx context.Context, healthChanged <-chan struct{}) {
	logger := klog.FromContext(ctx)
	last := map[int]health.Fault{}
	for {
		now := d.health.faults()
		d.healthEvents(last, now)
		if ctx.Err() != nil {
			return
		}
		if err := d.publish(ctx); err != nil {
			logger.Error(err, "Cannot publish the ResourceSlices again")
		}
		last = now
		select {
		case <-ctx.Done():
			return
		case <-healthChanged:
		case <-d.heldCh:
			// Prepares and unprepares come in bursts (a node starting or
			// draining pods): one publish for the burst, not one per
			// batch. Health changes below publish at once.
			select {
			case <-ctx.Done():
				return
			case <-healthChanged:
			case <-d.clock.After(heldPublishDelay):
			}
		}
	}
}

// heldPublishDelay gathers the changes of the groups in use into one
// publish. Until it, the scheduler sees groups that cannot take a claim,
// which it refuses; a released group waits as long to be offered again.
const heldPublishDelay = 500 * time.Millisecond

// healthEvents records an event for every GPU whose fault appeared,
// changed or went away between two views.
func (d *Driver) healthEvents(before, after map[int]health.Fault) {
	gpus := map[int]bool{}
	for x := range before {
		gpus[x] = true
	}
	for x := range after {
		gpus[x] = true
	}
	order := make([]int, 0, len(gpus))
	for x := range gpus {
		order = append(order, x)
	}
	slices.Sort(order)
	for _, x := range order {
		was, wasBad := before[x]
		is, isBad := after[x]
		uuid := d.inv.GPUs[x].UUID
		groups := strings.Join(d.groupsOf(x), " ")
		switch {
		case isBad && (!wasBad || was.Reason != is.Reason):
			taint, _ := draresources.GroupTaint([]int{x}, taintsOf(map[int]health.Fault{x: is}, d.health.lostEffect))
			note := fmt.Sprintf("GPU %d (%s) is unhealthy: %s. Its groups %s are tainted %s=%s:%s", x, uuid, is.Message, groups, taint.Key, taint.Value, taint.Effect)
			if is.Permanent() {
				note += "; a lost GPU stays unhealthy until it is reset and the plugin restarted"
			}
			d.event(corev1.EventTypeWarning, "GPUUnhealthy", note)
		case wasBad && !isBad:
			d.event(corev1.EventTypeNormal, "GPUHealthy", fmt.Sprintf("GPU %d (%s) is healthy again after %s; the taint is removed from its groups %s", x, uuid, was.Reason, groups))
		}
	}
}

// groupsOf names the groups that contain GPU x, in the plan's order.
func (d *Driver) groupsOf(x int) []string {
	var out []string
	for _, g := range d.plan.Ordered() {
		if slices.Contains(g.GPUs, x) {
			out = append(out, g.Name)
		}
	}
	return out
}

// taintsDropped says, once, that the API server does not keep device
// taints. The plugin keeps publishing; the kubelet's health stream still
// reports unhealthy devices, but the scheduler does not avoid them.
func (d *Driver) taintsDropped(ctx context.Context) {
	const msg = "The API server dropped the device taints of this node's ResourceSlices (feature DRADeviceTaints is off): the scheduler does not see unhealthy GPUs; the kubelet's health stream still reports them. Enable DRADeviceTaints to keep pods off unhealthy GPUs."
	klog.FromContext(ctx).Error(nil, msg)
	d.warnOnce("DeviceTaintsDropped", msg)
}
