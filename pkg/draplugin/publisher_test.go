package draplugin

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// The publisher on its own, with a helper that records what it is given.

type recordingHelper struct {
	mu  sync.Mutex
	got []resourceslice.DriverResources
}

func (h *recordingHelper) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, res)
	return nil
}

func (h *recordingHelper) last(pool string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var names []string
	for _, s := range h.got[len(h.got)-1].Pools[pool].Slices {
		for _, d := range s.Devices {
			names = append(names, d.Name)
		}
	}
	return names
}

type staticHealth map[int]health.Fault

func (s staticHealth) Faults() map[int]health.Fault         { return s }
func (s staticHealth) Subscribe() (<-chan struct{}, func()) { return nil, func() {} }

const seedConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
groups:
- {name: G01, gpus: [0, 1]}
- {name: G23, gpus: [2, 3]}
`

func testPublisher(t *testing.T, forced LayoutMode, faults staticHealth, config string) (*publisher, *recordingHelper) {
	t.Helper()
	node := simnodetest.New(t, "nvlink-2x4", config)
	np := draresources.NewNode("node-1", node.Plan, node.Inv)
	h := &recordingHelper{}
	p := newPublisher(np, forced, healthTaints{view: health.View{Source: faults}, lostEffect: resourceapi.DeviceTaintEffectNoExecute},
		noMIG{}, nil, newMetrics(), fake.NewClientset(), testingclock.NewFakeClock(time.Now()))
	return p, h
}

// noMIG is a node without MIG seats.
type noMIG struct{}

func (noMIG) Withdrawn() ([]draresources.MIGPartition, []int)  { return nil, nil }
func (noMIG) LostDevices() map[string]migseats.Lost            { return nil }
func (noMIG) InstanceUUID(types.UID, checkpoint.Device) string { return "" }
func (noMIG) Lost(types.UID, string) (migseats.Lost, bool)     { return migseats.Lost{}, false }

// By default what the node publishes does not depend on the seats held:
// holding a group asks for no publish, and a publish shows every group.
func TestPublisherPublishesEveryGroupWhateverIsHeld(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	p, h := testPublisher(t, LayoutAuto, nil, seedConfig)
	if err := p.publish(ctx, h); err != nil {
		t.Fatal(err)
	}
	idle := h.last("node-1")
	if len(idle) != 12 {
		t.Fatalf("published %v, want 12 devices", idle)
	}
	p.setUsage(seatledger.Usage{Held: draresources.Held{"g01-2x": 3, "g2-1x": 4, "g3-1x": 4}})
	select {
	case <-p.heldCh:
		t.Error("holding seats asked for a publish, but nothing published depends on them")
	default:
	}
	if err := p.publish(ctx, h); err != nil {
		t.Fatal(err)
	}
	if got := h.last("node-1"); !slices.Equal(got, idle) {
		t.Errorf("with G01 and G2, G3 full: published %v, idle %v", got, idle)
	}
	// Fencing a GPU taints its groups: that is published.
	p.setUsage(seatledger.Usage{Held: draresources.Held{"g01-2x": 3}, Fenced: map[int]string{0: "seats-unknown"}})
	select {
	case <-p.heldCh:
	default:
		t.Error("a fenced GPU asked for no publish")
	}
}

// With hideBlocked, a held group hides the groups it blocks, never itself,
// even when full.
func TestPublisherHideBlocked(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	p, h := testPublisher(t, LayoutAuto, nil, seedConfig+"unavailableGroups: hideBlocked\n")
	p.setUsage(seatledger.Usage{Held: draresources.Held{"g01-2x": 3}})
	select {
	case <-p.heldCh:
	default:
		t.Error("setUsage did not ask for a publish")
	}
	if err := p.publish(ctx, h); err != nil {
		t.Fatal(err)
	}
	got := h.last("node-1")
	if slices.Contains(got, "g0-1x") || slices.Contains(got, "g1-1x") || !slices.Contains(got, "g01-2x") || len(got) != 10 {
		t.Errorf("with G01 full: %v; its one-GPU groups are blocked and hidden, G01 itself stays", got)
	}
	if !slices.Equal(p.devices(), got) {
		t.Errorf("devices() %v, published %v", p.devices(), got)
	}
}

func TestPublisherTaintsAndReportsUnhealthyGroups(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	p, h := testPublisher(t, LayoutAuto, staticHealth{1: {Kind: health.KindLost, Reason: "gpu-lost", Message: "GPU is lost"}}, seedConfig)
	if err := p.publish(ctx, h); err != nil {
		t.Fatal(err)
	}
	tainted := map[string]resourceapi.DeviceTaintEffect{}
	for _, s := range h.got[len(h.got)-1].Pools["node-1"].Slices {
		for _, d := range s.Devices {
			for _, taint := range d.Taints {
				tainted[d.Name] = taint.Effect
			}
		}
	}
	if fmt.Sprint(tainted) != "map[g01-2x:NoExecute g1-1x:NoExecute]" {
		t.Errorf("tainted %v, want G1 and G01 with the lost GPU's effect", tainted)
	}
	bad := 0
	for _, r := range p.healthReports(time.Now()) {
		if r.Health == kubeletplugin.HealthStatusUnhealthy {
			bad++
			if r.Message != "GPU 1: GPU is lost" {
				t.Errorf("%s: %q", r.DeviceName, r.Message)
			}
		}
	}
	if bad != 2 {
		t.Errorf("%d unhealthy devices reported, want 2", bad)
	}
}

func TestPublisherFallsBackToOneDevicePerSeatOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	p, h := testPublisher(t, LayoutAuto, nil, seedConfig)
	p.fallBack(ctx, h, &resourceslice.DroppedFieldsError{}, []string{"DRAConsumableCapacity"})
	if p.currentLayout() != draresources.LayoutPerSeat {
		t.Fatalf("layout %s after a fallback", p.currentLayout())
	}
	if got := h.last("node-1"); !slices.Contains(got, "g01-2x-seat-0") {
		t.Errorf("after the fallback published %v, want one device per seat", got)
	}
	forced, fh := testPublisher(t, LayoutShared, nil, seedConfig)
	forced.fallBack(ctx, fh, &resourceslice.DroppedFieldsError{}, []string{"DRAConsumableCapacity"})
	if forced.currentLayout() != draresources.LayoutShared {
		t.Errorf("a forced shared layout fell back")
	}
}

func TestIsAPIError(t *testing.T) {
	slices := schema.GroupResource{Group: resourceapi.GroupName, Resource: "resourceslices"}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"conflict on a slice", apierrors.NewConflict(slices, "node-1-abc", errors.New("changed")), true},
		{"invalid slice", apierrors.NewInvalid(schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceSlice"}, "node-1-abc", field.ErrorList{field.Required(field.NewPath("spec"), "")}), true},
		{"forbidden slice, wrapped twice", fmt.Errorf("create resource slice: %w", fmt.Errorf("x: %w", apierrors.NewForbidden(slices, "s", errors.New("no")))), true},
		{"an overloaded server's 500 without details", apierrors.NewInternalError(errors.New("etcdserver: request timed out")), true},
		{"a server timeout", apierrors.NewTimeoutError("request did not complete", 1), true},
		{"request that never arrived", &url.Error{Op: "Post", URL: "https://10.0.0.1:6443/apis/resource.k8s.io/v1/resourceslices", Err: errors.New("connection refused")}, true},
		{"stale health reports", fmt.Errorf("no device health report was sent for 40s: %w", kubeletplugin.ErrRecoverable), false},
		{"invalid pool of our own", errors.New("pool node-1: slice 0: too many devices"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isAPIError(tt.err); got != tt.want {
				t.Errorf("isAPIError(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// A group with a faulty GPU counts its free seats as unhealthy.
func TestSeatMetricsOfAnUnhealthyGroup(t *testing.T) {
	p, _ := testPublisher(t, LayoutAuto, staticHealth{1: {Kind: health.KindLost, Reason: "gpu-lost", Message: "GPU is lost"}}, seedConfig)
	p.setUsage(seatledger.Usage{Held: draresources.Held{"g1-1x": 1}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(seatCollector{p})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["group"]+"/"+labels["state"]] = m.Gauge.GetValue()
		}
	}
	for key, want := range map[string]float64{"G1/held": 1, "G1/unhealthy": 3, "G1/free": 0, "G01/unhealthy": 3, "G01/blocked": 0, "G0/free": 4} {
		if got[key] != want {
			t.Errorf("kyb_seats %s = %v, want %v", key, got[key], want)
		}
	}
}
