package deviceplugin

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// resource serves one profile as one extended resource: the kubelet's
// DevicePlugin service on the profile's socket. Its seats are fixed at
// start; only the generation counters and the health change.
type resource struct {
	pluginapi.UnimplementedDevicePluginServer

	// name is the extended resource, such as kyb.ai/gpu-1x-seat.
	name    string
	profile *planner.Profile
	policy  v1alpha1.AllocationPolicy
	// groups in the policy's order: the order GetPreferredAllocation
	// breaks ties in. Seat IDs are numbered group by group in this order,
	// so seat n of groups[g] has index g*seatsPerGroup+n.
	groups []*planner.Group
	// ids are the seat IDs by index; seats maps them back.
	ids   []string
	seats map[string]seatRef
	// gens count the hand-outs of each seat, by index.
	gens []atomic.Int64
	// streams counts the open ListAndWatch streams: a registered resource
	// that nobody watches was dropped by the kubelet.
	streams atomic.Int32

	delivery delivery
	// mig is set on a MIG profile's resource: its seats are instances.
	mig    *migSeats
	health health.View
	// stopped is closed when the shim stops, ending every ListAndWatch.
	stopped <-chan struct{}
	logger  klog.Logger
}

// delivery is how Allocate hands a container its seats: the edits it
// builds from the inventory, sent in the response (envvar injection) or
// written into a CDI spec whose device the response names.
type delivery struct {
	inv       *inventory.Inventory
	edits     containeredits.Options
	injection Injection
	cdi       *cdi.Writer
	// nvidiaCDI names NVIDIA's own CDI device for a GPU, whose entry
	// brings the driver files (CDI injection only).
	nvidiaCDI func(index int, uuid string) string
	// sharing readies a group as its profile shares it.
	sharing *shimSharing
}

// seatRef locates a seat: its group (index into resource.groups), its
// seat number on the group, and its index among the resource's seats.
type seatRef struct {
	group int
	seat  int
	idx   int
}

func newResource(layout *planner.Plan, prof *planner.Profile, opts *Options, cdiWriter *cdi.Writer, sharing *shimSharing, stopped <-chan struct{}, logger klog.Logger) *resource {
	r := &resource{
		name: prof.Resource, profile: prof, policy: layout.Policy,
		groups: servedGroups(layout.OrderedProfile(prof), migGPUs(opts.Plan)), seats: map[string]seatRef{},
		delivery: delivery{inv: opts.Inventory, edits: opts.Edits, injection: opts.Injection, cdi: cdiWriter, nvidiaCDI: opts.NVIDIACDIDevice, sharing: sharing},
		health:   health.View{Source: opts.Health}, stopped: stopped,
		logger: klog.LoggerWithValues(logger, "resource", prof.Resource),
	}
	for g, group := range r.groups {
		for n := 0; n < prof.SeatsPerGroup; n++ {
			id := group.SeatID(n)
			r.seats[id] = seatRef{group: g, seat: n, idx: len(r.ids)}
			r.ids = append(r.ids, id)
		}
	}
	r.gens = make([]atomic.Int64, len(r.ids))
	return r
}

// pluginOptions are the options the shim registers with and reports: the
// kubelet reads them at registration, so both must say the same.
func pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions reports the options the shim registered with.
func (r *resource) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return pluginOptions(), nil
}

// PreStartContainer is not required (the options say so); the kubelet
// does not call it.
func (r *resource) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// ListAndWatch sends every seat, then the whole list again whenever the
// health of a seat changes. Every message is the full list: the kubelet
// replaces its view with each one. The stream ends when the kubelet goes
// away or the shim stops; the kubelet then counts the resource as failed
// until it is registered again.
func (r *resource) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	r.streams.Add(1)
	defer r.streams.Add(-1)
	changed, unsubscribe := r.health.Subscribe()
	defer unsubscribe()
	var last []string
	for {
		devices := r.devices()
		if health := healthOf(devices); !slices.Equal(health, last) {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
				return fmt.Errorf("send the seats of %s: %w", r.name, err)
			}
			r.logger.V(2).Info("Sent the seats to the kubelet", "seats", len(devices), "unhealthy", unhealthyIDs(devices))
			last = health
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-r.stopped:
			return nil
		case _, ok := <-changed:
			if !ok {
				// The source ended its subscription: no more changes.
				changed = nil
			}
		}
	}
}

// devices is every seat with its health and NUMA node, in seat order.
func (r *resource) devices() []*pluginapi.Device {
	bad := r.health.Faults()
	out := make([]*pluginapi.Device, 0, len(r.ids))
	for i, id := range r.ids {
		g := r.groups[r.seats[id].group]
		d := &pluginapi.Device{ID: id, Health: kubeletHealth(g, bad)}
		if r.mig != nil && r.mig.blocked[i] != "" {
			// A seat that cannot be made is never handed out.
			d.Health = pluginapi.Unhealthy
		}
		// The TopologyManager aligns CPUs with the seat's NUMA node; a
		// group spanning sockets has none to offer.
		if g.NUMANode >= 0 {
			d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMANode)}}}
		}
		out = append(out, d)
	}
	return out
}

// servedGroups leaves out the groups on GPUs the plan gives to MIG
// profiles: the kubelet counts each resource on its own, and a GPU in MIG
// mode handed out whole shows a container no CUDA device.
func servedGroups(groups []*planner.Group, mig map[int]bool) []*planner.Group {
	return slices.DeleteFunc(slices.Clone(groups), func(g *planner.Group) bool {
		return slices.ContainsFunc(g.GPUs, func(x int) bool { return mig[x] })
	})
}

// kubeletHealth is the kubelet's health value for every seat of g: a seat
// is unhealthy when any GPU of its group is, since its container would see
// that GPU.
func kubeletHealth(g *planner.Group, faults map[int]health.Fault) string {
	if ok, _ := health.OfGPUs(g.GPUs, faults); !ok {
		return pluginapi.Unhealthy
	}
	return pluginapi.Healthy
}

func healthOf(devices []*pluginapi.Device) []string {
	out := make([]string, len(devices))
	for i, d := range devices {
		out[i] = d.Health
	}
	return out
}

func unhealthyIDs(devices []*pluginapi.Device) []string {
	var out []string
	for _, d := range devices {
		if d.Health != pluginapi.Healthy {
			out = append(out, d.ID)
		}
	}
	return out
}
