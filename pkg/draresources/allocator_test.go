package draresources_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// These tests run the scheduler's own allocator (the incubating feature
// set kube-scheduler 1.37 uses) over exactly what the plugin publishes.
// Expected outcomes are written out by hand.

const seedConfig = "../../api/kyb.ai/v1alpha1/testdata/seed-configmap.yaml"

type node struct {
	inv     *inventory.Inventory
	plan    *planner.Plan
	cluster *schedulertest.Cluster
}

func newNode(t testing.TB, preset, config string, layout draresources.Layout) *node {
	t.Helper()
	if config == "seed" {
		data, err := os.ReadFile(seedConfig)
		if err != nil {
			t.Fatal(err)
		}
		config = string(data)
	}
	sn := simnodetest.New(t, preset, config)
	inv, plan := sn.Inv, sn.Plan
	c := schedulertest.New(schedulertest.SchedulerFeatures())
	c.AddNode("node-1", draresources.Resources(plan, inv, "node-1", layout), driver.Name)
	c.AddClasses(draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{ExtendedResources: true})...)
	return &node{inv: inv, plan: plan, cluster: c}
}

var ctx = context.Background()

// fill allocates claims of one class until one does not fit and returns
// the devices they got, in order.
func (n *node) fill(t testing.TB, class string, mutate ...func(*resourceapi.DeviceRequest)) []string {
	t.Helper()
	var got []string
	for i := 0; i < 1000; i++ {
		r, err := n.cluster.Allocate(ctx, schedulertest.Claim(fmt.Sprintf("%s-%d", class, i), class, 1, mutate...), "node-1")
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			return got
		}
		got = append(got, r.Devices.Results[0].Device)
	}
	t.Fatal("never full")
	return nil
}

func (n *node) allocate(t testing.TB, name, class string, mutate ...func(*resourceapi.DeviceRequest)) *resourceapi.AllocationResult {
	t.Helper()
	r, err := n.cluster.Allocate(ctx, schedulertest.Claim(name, class, 1, mutate...), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func count(devices []string) map[string]int {
	out := map[string]int{}
	for _, d := range devices {
		out[d]++
	}
	return out
}

const (
	class1x = "gpu-1x-seat.kyb.ai"
	class2x = "gpu-2x-seat.kyb.ai"
	class4x = "gpu-4x-seat.kyb.ai"
)

func TestSeedConfigFitsExactly32OneXSeats(t *testing.T) {
	n := newNode(t, "dgx-h100", "seed", draresources.LayoutShared)
	got := n.fill(t, class1x)
	if len(got) != 32 {
		t.Fatalf("%d one-seat 1x claims fit, want 32", len(got))
	}
	for dev, k := range count(got) {
		if k != 4 {
			t.Errorf("%s got %d seats, want 4", dev, k)
		}
	}
	// Pack: the first group is filled before the next is touched.
	if strings.Join(got[:5], " ") != "g0-1x g0-1x g0-1x g0-1x g1-1x" {
		t.Errorf("first placements %v, want g0-1x four times then g1-1x", got[:5])
	}
}

func TestOverlappingGroupsExcludeEachOther(t *testing.T) {
	n := newNode(t, "dgx-h100", "seed", draresources.LayoutShared)
	r := n.allocate(t, "train", class2x)
	if r == nil || r.Devices.Results[0].Device != "g01-2x" {
		t.Fatalf("2x seat: %+v, want g01-2x", r)
	}
	got := n.fill(t, class1x)
	if len(got) != 24 {
		t.Errorf("%d 1x seats fit next to a 2x seat on G01, want 24", len(got))
	}
	c := count(got)
	if c["g0-1x"] != 0 || c["g1-1x"] != 0 {
		t.Errorf("1x seats landed on GPU 0 or 1 while G01 is in use: %v", c)
	}
	// Later seats of the same 2x group still fit: they consume seats, not counters.
	for i := 0; i < 2; i++ {
		if r := n.allocate(t, fmt.Sprintf("train-%d", i), class2x); r == nil || r.Devices.Results[0].Device != "g01-2x" {
			t.Fatalf("seat %d of G01: %+v", i+2, r)
		}
	}
	if r := n.allocate(t, "train-4", class2x); r != nil {
		t.Errorf("a 2x seat fit with G01 full and every other 2x group broken by 1x seats: %+v", r.Devices.Results)
	}
}

func TestOverprovisionedProfilesShareGPUs(t *testing.T) {
	n := newNode(t, "dgx-h100", `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, allowOverprovision: true}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
groups: [{name: G01, gpus: [0, 1]}, {name: G23, gpus: [2, 3]}]
`, draresources.LayoutShared)
	if r := n.allocate(t, "train", class2x); r == nil || r.Devices.Results[0].Device != "g01-2x" {
		t.Fatalf("2x seat: %+v", r)
	}
	got := n.fill(t, class1x)
	c := count(got)
	if len(got) != 32 || c["g0-1x"] != 4 || c["g1-1x"] != 4 {
		t.Errorf("with overprovisioning every 1x seat fits, on GPU 0 and 1 too: %d seats, %v", len(got), c)
	}
}

func TestNVLinkSelectorOnPCIeNodeGetsNothing(t *testing.T) {
	n := newNode(t, "pcie-8gpu", "", draresources.LayoutShared)
	sel := schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].interconnect == "nvlink"`)
	if r := n.allocate(t, "nv", class2x, sel); r != nil {
		t.Errorf("an NVLink 2x seat was allocated on a node without NVLink: %+v", r.Devices.Results)
	}
	nv := newNode(t, "nvlink-2x4", "", draresources.LayoutShared)
	if r := nv.allocate(t, "nv", class4x, sel); r == nil || r.Devices.Results[0].Device != "g0123-4x" {
		t.Errorf("NVLink 4x seat on nvlink-2x4: %+v, want g0123-4x", r)
	}
}

func TestSeatsNotMemoryAreWhatASeatConsumes(t *testing.T) {
	n := newNode(t, "single-gpu", "profiles: [{resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2}]\n", draresources.LayoutShared)
	a := n.allocate(t, "a", class1x)
	b := n.allocate(t, "b", class1x)
	if a == nil || b == nil {
		t.Fatalf("two 1x seats on one 1x group must coexist: %v %v", a, b)
	}
	if *a.Devices.Results[0].ShareID == *b.Devices.Results[0].ShareID {
		t.Error("two seats got the same share ID")
	}
	for _, r := range []*resourceapi.AllocationResult{a, b} {
		cc := r.Devices.Results[0].ConsumedCapacity
		seats := cc[draresources.SeatsCapacity]
		if len(cc) != 1 || seats.String() != "1" {
			t.Errorf("consumed capacity %v, want seats: 1 and nothing else", cc)
		}
	}
	if r := n.allocate(t, "c", class1x); r != nil {
		t.Error("a third seat fit on a group of two")
	}
}

func TestClaimCanAskForSeveralSeatsOfOneGroup(t *testing.T) {
	n := newNode(t, "single-gpu", "profiles: [{resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}]\n", draresources.LayoutShared)
	big := n.allocate(t, "big", class1x, schedulertest.WithCapacity("seats", "3"))
	if big == nil {
		t.Fatal("a 3-seat share does not fit on an empty 4-seat group")
	}
	if q := big.Devices.Results[0].ConsumedCapacity[draresources.SeatsCapacity]; q.String() != "3" {
		t.Fatalf("3-seat share: %+v", big)
	}
	if r := n.allocate(t, "one", class1x); r == nil {
		t.Error("the fourth seat must still fit")
	}
	if r := n.allocate(t, "two", class1x); r != nil {
		t.Error("a fifth seat fit on a group of four")
	}
}

func TestExtendedResourceIsServedByDRA(t *testing.T) {
	n := newNode(t, "dgx-h100", "", draresources.LayoutShared)
	claim, err := n.cluster.ExtendedResourceClaim("legacy", "kyb.ai/gpu-2x-seat", 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := n.cluster.Allocate(ctx, claim, "node-1")
	if err != nil || r == nil {
		t.Fatalf("kyb.ai/gpu-2x-seat: 1 is not satisfiable: %v %v", r, err)
	}
	if d := r.Devices.Results[0].Device; d != "g01-2x" {
		t.Errorf("got %s, want g01-2x", d)
	}
}

// Every preset with the default config: the number of seats that fit per
// profile on an empty node, written out by hand.
func TestEveryPresetServesItsProfiles(t *testing.T) {
	tests := []struct {
		preset string
		seats  map[string]int
	}{
		{"dgx-h100", map[string]int{class1x: 8, class2x: 4, class4x: 2}},
		{"dgx-a100", map[string]int{class1x: 8, class2x: 4, class4x: 2}},
		{"nvlink-2x4", map[string]int{class1x: 8, class2x: 4, class4x: 2}},
		{"pcie-8gpu", map[string]int{class1x: 8, class2x: 4, class4x: 2}},
		{"workstation-2gpu", map[string]int{class1x: 2, class2x: 1}},
		{"single-gpu", map[string]int{class1x: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.preset, func(t *testing.T) {
			for class, want := range tc.seats {
				n := newNode(t, tc.preset, "", draresources.LayoutShared)
				if got := len(n.fill(t, class)); got != want {
					t.Errorf("%s: %d seats fit, want %d", class, got, want)
				}
			}
		})
	}
}

func TestPerSeatLayoutKeepsExclusivity(t *testing.T) {
	n := newNode(t, "dgx-h100", "seed", draresources.LayoutPerSeat)
	// Exclusive layout: 2x gets G01 and G23 (3 seats each), 1x gets GPUs 4-7 (4 seats each).
	one := n.fill(t, class1x)
	two := n.fill(t, class2x)
	if len(one) != 16 || len(two) != 6 {
		t.Fatalf("per-seat layout fits %d 1x and %d 2x seats, want 16 and 6", len(one), len(two))
	}
	for _, d := range one {
		if strings.HasPrefix(d, "g0-") || strings.HasPrefix(d, "g1-") || strings.HasPrefix(d, "g2-") || strings.HasPrefix(d, "g3-") {
			t.Errorf("1x seat %s on a GPU of a 2x group", d)
		}
	}
	if one[0] != "g4-1x-seat-0" || two[0] != "g01-2x-seat-0" {
		t.Errorf("first seats %s and %s", one[0], two[0])
	}
}

func TestPublishedDevicesRespectAPILimits(t *testing.T) {
	all := v1alpha1.KnownAttributes
	var names []string
	for _, a := range all {
		names = append(names, string(a))
	}
	full := "attributes: [" + strings.Join(names, ", ") + "]\nprofiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 64}\n- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 64}\n"
	for _, preset := range simnode.Presets() {
		for _, layout := range []draresources.Layout{draresources.LayoutShared, draresources.LayoutPerSeat} {
			n := newNode(t, preset, full, layout)
			res := draresources.Resources(n.plan, n.inv, "node-1", layout)
			for i, s := range res.Pools["node-1"].Slices {
				if s.Devices != nil && s.SharedCounters != nil {
					t.Errorf("%s/%s slice %d has devices and counters", preset, layout, i)
				}
				max := resourceapi.ResourceSliceMaxDevices
				for _, d := range s.Devices {
					if len(d.ConsumesCounters) > 0 || len(d.Taints) > 0 {
						max = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
					}
				}
				if len(s.Devices) > max {
					t.Errorf("%s/%s slice %d has %d devices, limit %d", preset, layout, i, len(s.Devices), max)
				}
				for _, d := range s.Devices {
					if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
						t.Errorf("%s: %d attributes and capacities", d.Name, n)
					}
					if len(d.Capacity) > 1 {
						t.Errorf("%s has capacities %v: seats must be the only one", d.Name, d.Capacity)
					}
					for k, v := range d.Attributes {
						for _, s := range []*string{v.StringValue, v.VersionValue} {
							if s != nil && len(*s) > resourceapi.DeviceAttributeMaxValueLength {
								t.Errorf("%s: attribute %s is %d characters", d.Name, k, len(*s))
							}
						}
					}
					if len(d.Name) > 63 {
						t.Errorf("device name %s is longer than a DNS label", d.Name)
					}
				}
			}
		}
	}
}

func TestDefaultAttributesAreLean(t *testing.T) {
	n := newNode(t, "dgx-h100", "", draresources.LayoutShared)
	res := draresources.Resources(n.plan, n.inv, "node-1", draresources.LayoutShared)
	d := res.Pools["node-1"].Slices[1].Devices[8] // g01-2x in pack order
	if d.Name != "g01-2x" {
		t.Fatalf("device 8 is %s", d.Name)
	}
	want := map[string]string{"profile": "2x", "group": "G01", "gpuIndices": "0,1", "interconnect": "nvlink"}
	if len(d.Attributes) != len(want) {
		t.Errorf("attributes %v, want only %v", d.Attributes, want)
	}
	for k, v := range want {
		if got := d.Attributes[resourceapi.QualifiedName(k)].StringValue; got == nil || *got != v {
			t.Errorf("attribute %s = %v, want %s", k, got, v)
		}
	}
}

func TestOptionalAttributes(t *testing.T) {
	n := newNode(t, "dgx-h100", `attributes: [profile, gpuCount, productName, architecture, cudaComputeCapability, driverVersion, memoryMiB, resource.kubernetes.io/pcieRoot, resource.kubernetes.io/numaNode]`, draresources.LayoutShared)
	res := draresources.Resources(n.plan, n.inv, "node-1", draresources.LayoutShared)
	devs := res.Pools["node-1"].Slices[1].Devices
	g01 := devs[8].Attributes
	if *g01["gpuCount"].IntValue != 2 || *g01["productName"].StringValue != "NVIDIA H100 80GB HBM3" || *g01["architecture"].StringValue != "hopper" ||
		*g01["cudaComputeCapability"].VersionValue != "9.0.0" || *g01["driverVersion"].VersionValue != "580.95.5" || *g01["memoryMiB"].IntValue != 81559 ||
		*g01["resource.kubernetes.io/pcieRoot"].StringValue != "pci0000:15" || *g01["resource.kubernetes.io/numaNode"].IntValue != 0 {
		t.Errorf("g01-2x attributes %v", g01)
	}
	g0123 := devs[12].Attributes
	if _, ok := g0123["resource.kubernetes.io/pcieRoot"]; ok {
		t.Error("G0123 spans two PCIe roots and must not claim one")
	}
	sel := schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))`)
	if r := n.allocate(t, "cc", class4x, sel); r == nil {
		t.Error("a version selector on cudaComputeCapability found nothing")
	}
}

// A one-seat group is an ordinary device: the allocator marks it allocated
// (no share ID), skips it from then on, and counters still keep the groups
// that overlap it out; a claim that names its one seat still fits.
func TestOneSeatGroupsArePlainDevices(t *testing.T) {
	n := newNode(t, "dgx-h100", "", draresources.LayoutShared)
	one := n.allocate(t, "one", class1x, schedulertest.WithCapacity("seats", "1"))
	if one == nil {
		t.Fatal("a claim for one seat does not fit on an empty node")
	}
	res := one.Devices.Results[0]
	if res.Device != "g0-1x" || res.ShareID != nil {
		t.Fatalf("one-seat group: %+v, want g0-1x without a share ID", res)
	}
	if r := n.allocate(t, "two", class1x, schedulertest.WithCapacity("seats", "2")); r != nil {
		t.Errorf("two seats of a one-seat group: %+v", r.Devices.Results)
	}
	got := n.fill(t, class1x)
	if len(got) != 7 || count(got)["g0-1x"] != 0 {
		t.Errorf("1x seats after g0-1x: %v, want the 7 other GPUs once each", got)
	}
	if r := n.allocate(t, "wide", class2x); r != nil {
		t.Errorf("a 2x seat fit on a node whose GPUs all hold 1x seats: %+v", r.Devices.Results)
	}
	for _, s := range n.cluster.Slices() {
		for _, d := range s.Spec.Devices {
			if d.AllowMultipleAllocations != nil || d.Capacity[draresources.SeatsCapacity].RequestPolicy != nil {
				t.Errorf("device %s: one-seat group published as a shared device", d.Name)
			}
		}
	}
}
