package draplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

// slicePublisher publishes a pool's slices: the kubeletplugin helper.
type slicePublisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// publisher owns what the node publishes: the layout (shared, or one
// device per seat after a fallback), the devices published last, the seats
// held per group (with unavailableGroups: hideBlocked, groups blocked by
// one in use are hidden), and the taints of unhealthy and fenced GPUs. It publishes again when any of them
// changes, and when the kubelet wipes the node's slices.
type publisher struct {
	node    draresources.Node
	forced  LayoutMode
	health  healthTaints
	events  *nodeevents.Recorder
	metrics *metrics
	// client watches the node's slices for wipes.
	client kubernetes.Interface
	clock  clock.WithTicker
	// mig says what the MIG seats withdraw from what is published, and
	// which devices lost their instance.
	mig migView

	// publishMu serialises publishing: start-up, a health change, a layout
	// fallback and a kubelet's wipe may republish at once.
	publishMu sync.Mutex
	// mu guards the fields below.
	mu        sync.Mutex
	layout    draresources.Layout
	published []string
	usage     seatledger.Usage
	// heldCh says the groups in use changed (publish again).
	heldCh chan struct{}
}

// migView is what the publisher reads of the MIG seats (migseats.Seats).
type migView interface {
	// Withdrawn are the partitions the plugin did not make and the MIG
	// GPUs none of whose MIG devices can be published, found at start
	// before anything is published.
	Withdrawn() ([]draresources.MIGPartition, []int)
	// LostDevices are the MIG devices of held claims whose instance is
	// gone.
	LostDevices() map[string]migseats.Lost
}

func newPublisher(node draresources.Node, forced LayoutMode, h healthTaints, mig migView, events *nodeevents.Recorder, m *metrics, client kubernetes.Interface, clk clock.WithTicker) *publisher {
	p := &publisher{
		node: node, forced: forced, health: h, mig: mig, events: events, metrics: m, client: client, clock: clk,
		layout: draresources.LayoutShared, heldCh: make(chan struct{}, 1),
	}
	if forced == LayoutPerSeat {
		p.layout = draresources.LayoutPerSeat
	}
	return p
}

// setUsage records what the held claims use and has the slices published
// again where that changes them: fenced GPUs are tainted and untainted,
// and with hideBlocked blocked groups come and go. By default the claims
// held change nothing published, and a prepare or unprepare costs no
// publish. The ledger calls it with its lock held.
func (p *publisher) setUsage(u seatledger.Usage) {
	p.mu.Lock()
	old := p.usage
	p.usage = u
	p.mu.Unlock()
	changed := !maps.Equal(old.Fenced, u.Fenced) ||
		(p.node.Plan.HideBlocked && !slices.Equal(old.Held.Devices(), u.Held.Devices()))
	if changed {
		p.nudge()
	}
}

// nudge has the slices published again soon: what they say of a device
// changed outside the ledger and the health monitor (a MIG instance went
// or was made again).
func (p *publisher) nudge() {
	select {
	case p.heldCh <- struct{}{}:
	default:
	}
}

// publish publishes the plan in the current layout, with the taints of
// the unhealthy GPUs, through to (the kubelet plugin helper).
func (p *publisher) publish(ctx context.Context, to slicePublisher) error {
	p.publishMu.Lock()
	defer p.publishMu.Unlock()
	if err := to.PublishResources(ctx, p.resources()); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	return nil
}

// resources computes what to publish in the current layout, with the
// taints of unhealthy GPUs, and records the device names (the health
// stream reports them).
func (p *publisher) resources() resourceslice.DriverResources {
	p.mu.Lock()
	layout, held, fenced := p.layout, maps.Clone(p.usage.Held), maps.Clone(p.usage.Fenced)
	p.mu.Unlock()
	node := p.node
	res := draresources.Resources(node.Plan, node.Inv, node.Pool, layout)
	partitions, noMIG := p.mig.Withdrawn()
	draresources.WithdrawAroundPartitions(res, node.Plan, partitions)
	draresources.WithdrawMIGOf(res, node.Plan, noMIG)
	hidden := 0
	if layout == draresources.LayoutShared && node.Plan.HideBlocked {
		hidden = draresources.HideBlocked(res, node.Plan, held)
	}
	p.metrics.hidden.Set(float64(hidden))
	draresources.Taint(res, node.Plan, p.health.taints())
	p.health.taintInstances(res, node.Plan, node.Index)
	migseats.TaintLost(res, p.mig.LostDevices())
	draresources.Fence(res, node.Plan, fenced)
	var names []string
	perProfile := map[string]int{}
	for _, s := range res.Pools[node.Pool].Slices {
		for _, dev := range s.Devices {
			names = append(names, dev.Name)
			if ref, ok := node.Index[dev.Name]; ok {
				perProfile[ref.Group.Profile.Name]++
			}
		}
	}
	p.mu.Lock()
	p.published = names
	p.mu.Unlock()
	p.metrics.published.Reset()
	for prof, n := range perProfile {
		p.metrics.published.WithLabelValues(prof, string(layout)).Set(float64(n))
	}
	return res
}

func (p *publisher) currentLayout() draresources.Layout {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.layout
}

// devices are the names of the devices published last.
func (p *publisher) devices() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.published)
}

// fallBack switches to one device per seat on the exclusive layout, once
// the API server dropped fields that shared groups need.
func (p *publisher) fallBack(ctx context.Context, to slicePublisher, dropped *resourceslice.DroppedFieldsError, features []string) {
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	if p.layout == draresources.LayoutPerSeat || p.forced == LayoutShared {
		p.mu.Unlock()
		logger.Error(dropped, "The API server dropped fields of the ResourceSlices and the plugin cannot fall back further", "disabledFeatures", features, "layout", p.forced)
		return
	}
	p.layout = draresources.LayoutPerSeat
	p.mu.Unlock()
	_, why := p.node.Plan.ExclusiveLayout()
	p.events.Warning(ctx, nodeevents.ReasonSeatLayoutFallback, fmt.Sprintf("The API server dropped fields that shared GPU groups need (features off: %s); publishing one device per seat instead, where %s. Enable DRAConsumableCapacity and DRAPartitionableDevices to get shared groups.",
		strings.Join(features, ", "), why))
	if err := p.publish(ctx, to); err != nil {
		logger.Error(err, "Cannot publish the per-seat layout")
	}
}

// taintsDropped says, once, that the API server does not keep device
// taints. The plugin keeps publishing; the kubelet's health stream still
// reports unhealthy devices, but the scheduler does not avoid them.
func (p *publisher) taintsDropped(ctx context.Context) {
	p.events.WarningOnce(ctx, nodeevents.ReasonDeviceTaintsDropped, "The API server dropped the device taints of this node's ResourceSlices (feature DRADeviceTaints is off): the scheduler does not see unhealthy GPUs; the kubelet's health stream still reports them. Enable DRADeviceTaints to keep pods off unhealthy GPUs.")
}

// healthTaints turns the GPU health monitor's faults into device taints.
type healthTaints struct {
	view health.View
	// lostEffect is the taint effect of a lost GPU.
	lostEffect resourceapi.DeviceTaintEffect
}

func (h healthTaints) faults() map[int]health.Fault { return h.view.Faults() }

// taints says how each unhealthy GPU taints the devices of its groups:
// NoSchedule, or the configured effect for a lost GPU. NoSchedule leaves
// running pods alone: a pod that saw one XID may well finish, and
// evicting it is the operator's choice (health.gpuLostEffect: NoExecute
// for GPUs that are gone for good).
func (h healthTaints) taints() draresources.Faults {
	return taintsOf(h.faults(), h.lostEffect)
}

func taintsOf(bad map[int]health.Fault, lostEffect resourceapi.DeviceTaintEffect) draresources.Faults {
	if len(bad) == 0 {
		return nil
	}
	out := draresources.Faults{}
	for x, f := range bad {
		effect := resourceapi.DeviceTaintEffectNoSchedule
		if f.Kind == health.KindLost && lostEffect != "" {
			effect = lostEffect
		}
		out[x] = draresources.Fault{Reason: f.Reason, Effect: effect}
	}
	return out
}
