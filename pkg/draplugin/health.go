package draplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// healthCheckTimeout is how long the kubelet trusts a device's health
// report; the plugin re-sends well inside it (Options.HealthReportInterval).
const healthCheckTimeout = 30 * time.Second

// WatchHealthStatus reports every published device to the kubelet, then
// again whenever health changes and at least every HealthReportInterval,
// well inside the kubelet's timeout after which a device counts as
// Unknown.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	ticker := d.opts.Clock.NewTicker(d.opts.Health.ReportInterval)
	defer ticker.Stop()
	changed, unsubscribe := d.publisher.health.view.Subscribe()
	defer unsubscribe()
	for {
		report := kubeletplugin.DeviceHealthReport{Devices: d.publisher.healthReports(d.opts.Clock.Now())}
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		case <-changed:
		}
	}
}

// healthReports is the health of every device published last. A MIG
// device is as healthy as its instance and its GPU; a group device as its
// GPUs and the memory of their instances (another fault of one MIG
// instance leaves it alone).
func (p *publisher) healthReports(now time.Time) []kubeletplugin.DeviceHealth {
	bad := p.health.faults()
	badInstances := p.health.view.InstanceFaults()
	lost := p.mig.LostDevices()
	var out []kubeletplugin.DeviceHealth
	for _, name := range p.devices() {
		h := kubeletplugin.DeviceHealth{
			PoolName: p.node.Pool, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: now, HealthCheckTimeout: healthCheckTimeout,
		}
		if ref, ok := p.node.Index[name]; ok {
			healthy, msg := health.OfGroup(ref.Group.GPUs, bad, badInstances)
			if ref.MIG != nil {
				healthy, msg = health.OfInstance(instanceOf(*ref.MIG), bad, badInstances)
				if li, ok := lost[name]; ok {
					msg = strings.TrimPrefix(msg+"; "+li.Note(), "; ")
					healthy = false
				}
			}
			if !healthy {
				h.Health = kubeletplugin.HealthStatusUnhealthy
				h.Message = msg
			}
		}
		out = append(out, h)
	}
	return out
}

// instanceOf is the MIG instance a MIG device stands for.
func instanceOf(d planner.MIGDevice) health.Instance {
	return health.Instance{GPU: d.GPU.Index(), Placement: d.Placement}
}

// taintInstances taints the devices of res that an unhealthy instance's
// fault reaches (health.Instance.Reaches): every profile's MIG device at
// the instance's placement, since whichever is allocated next gets the
// same memory slices, and for a memory fault every MIG device whose
// placement shares one of them and every group device (of either layout,
// index) holding the instance's GPU whole (health.MemoryFaults), which
// hands out all its memory once the instance is gone. A MIG device
// reached by several faults takes the value of its own placement's, else
// of the first in placement order; a group device the first in GPU and
// placement order. A device its GPU's fault tainted already keeps that
// taint alone (one taint per key: a GPU fault is at least as strong).
// Instance faults are never a loss: NoSchedule.
func (h healthTaints) taintInstances(res resourceslice.DriverResources, plan *planner.Plan, index map[string]draresources.DeviceRef) {
	bad := h.view.InstanceFaults()
	if len(bad) == 0 {
		return
	}
	taints := map[string]resourceapi.DeviceTaint{}
	for _, d := range plan.MIGDevices() {
		if reaching := health.Reaching(instanceOf(d), bad); len(reaching) > 0 {
			taints[d.DeviceName()] = instanceTaint(bad[reaching[0]])
		}
	}
	for name, ref := range index {
		if ref.MIG != nil {
			continue
		}
		if memory := health.MemoryFaults(ref.Group.GPUs, bad); len(memory) > 0 {
			taints[name] = instanceTaint(bad[memory[0]])
		}
	}
	draresources.TaintDevices(res, taints)
}

// instanceTaint is the taint of an unhealthy instance's devices: the
// taint of a group of one GPU with that fault, whose value GroupTaint
// makes a label value.
func instanceTaint(f health.Fault) resourceapi.DeviceTaint {
	t, _ := draresources.GroupTaint([]int{0}, draresources.Faults{0: {Reason: f.Reason, Effect: resourceapi.DeviceTaintEffectNoSchedule}})
	return t
}

// instanceHealthEvents records an event for every MIG instance whose
// fault appeared, changed or went away between two views.
func (p *publisher) instanceHealthEvents(ctx context.Context, before, after map[health.Instance]health.Fault) {
	all := map[health.Instance]bool{}
	for in := range before {
		all[in] = true
	}
	for in := range after {
		all[in] = true
	}
	order := func(a, b health.Instance) int {
		if a.GPU != b.GPU {
			return a.GPU - b.GPU
		}
		if a.Placement.Start != b.Placement.Start {
			return a.Placement.Start - b.Placement.Start
		}
		return a.Placement.Size - b.Placement.Size
	}
	for _, in := range slices.SortedFunc(maps.Keys(all), order) {
		was, wasBad := before[in]
		is, isBad := after[in]
		uuid := p.node.Inv.GPUs[in.GPU].UUID
		switch {
		case isBad && (!wasBad || was.Reason != is.Reason):
			taint := instanceTaint(is)
			devices, others := strings.Join(p.devicesOf(in, is), " "), "the GPU's other instances are not"
			if is.Memory() {
				devices += p.wholeGroupsOf(in)
				others = "a memory fault reaches every placement that shares a memory slice with the instance, and every group holding the GPU whole; the GPU's other placements are not tainted"
			}
			p.events.Warning(ctx, nodeevents.ReasonGPUUnhealthy, fmt.Sprintf("MIG instance at %s of GPU %d (%s) is unhealthy: %s. Its devices %s are tainted %s=%s:%s; %s",
				in.Placement, in.GPU, uuid, is.Message, devices, taint.Key, taint.Value, taint.Effect, others))
		case wasBad && !isBad:
			devices := strings.Join(p.devicesOf(in, was), " ")
			if was.Memory() {
				devices += p.wholeGroupsOf(in)
			}
			p.events.Normal(ctx, nodeevents.ReasonGPUHealthy, fmt.Sprintf("MIG instance at %s of GPU %d (%s) is healthy again after %s; the taint is removed from its devices %s",
				in.Placement, in.GPU, uuid, was.Reason, devices))
		}
	}
}

// devicesOf names the MIG devices of the plan that a fault of an instance
// reaches.
func (p *publisher) devicesOf(in health.Instance, f health.Fault) []string {
	var out []string
	for _, d := range p.node.Plan.MIGDevices() {
		if in.Reaches(f, instanceOf(d)) {
			out = append(out, d.DeviceName())
		}
	}
	slices.Sort(out)
	return out
}

// wholeGroupsOf names, for an event, the groups holding an instance's GPU
// whole, which a memory fault of the instance taints (taintInstances):
// " and the groups G0 G01 holding GPU 0 whole", or nothing.
func (p *publisher) wholeGroupsOf(in health.Instance) string {
	groups := p.groupsOf(in.GPU)
	if len(groups) == 0 {
		return ""
	}
	return fmt.Sprintf(" and the groups %s holding GPU %d whole", strings.Join(groups, " "), in.GPU)
}
