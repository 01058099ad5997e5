package seatview_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

const seed = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
groups: [{name: G01, gpus: [0, 1]}, {name: G23, gpus: [2, 3]}]
`

// cluster is nodes published as the plugin publishes them, the real
// allocator over them, and the claims it allocated.
type cluster struct {
	t      *testing.T
	sched  *schedulertest.Cluster
	slices []resourceapi.ResourceSlice
	claims []resourceapi.ResourceClaim
}

func newCluster(t *testing.T, layout draresources.Layout, nodes ...string) *cluster {
	c := &cluster{t: t, sched: schedulertest.New(schedulertest.SchedulerFeatures())}
	for _, name := range nodes {
		sn := simnodetest.New(t, "nvlink-2x4", seed)
		res := draresources.Resources(sn.Plan, sn.Inv, name, layout)
		c.sched.AddNode(name, res, driver.Name)
		for _, s := range draresources.ResourceSlices(res, name) {
			c.slices = append(c.slices, *s)
		}
		c.sched.AddClasses(draresources.DeviceClasses(sn.Plan.Profiles, draresources.DeviceClassOptions{})...)
	}
	return c
}

// allocate allocates a claim of class with selector on node, its request
// changed by mutate, reserved for pod, and writes the seat data the plugin writes after prepare when
// seats is not nil.
func (c *cluster) allocate(ns, name, class, selector, node, pod string, seats []int, mutate ...func(*resourceapi.DeviceRequest)) *resourceapi.AllocationResult {
	c.t.Helper()
	if selector != "" {
		mutate = append(mutate, schedulertest.WithSelector(selector))
	}
	claim := schedulertest.Claim(name, class, 1, mutate...)
	claim.Namespace = ns
	alloc, err := c.sched.Allocate(context.Background(), claim, node)
	if err != nil || alloc == nil {
		c.t.Fatalf("allocate %s/%s: %v %v", ns, name, alloc, err)
	}
	claim.Status.Allocation = alloc
	if pod != "" {
		claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID(pod)}}
	}
	if seats != nil {
		r := alloc.Devices.Results[0]
		gens := make([]int64, len(seats))
		for i := range gens {
			gens[i] = int64(10 + i)
		}
		data, _ := json.Marshal(v1alpha1.SeatStatus{Group: "x", Seats: seats, Generations: gens})
		st := resourceapi.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device, Data: &runtime.RawExtension{Raw: data}}
		if r.ShareID != nil {
			id := string(*r.ShareID)
			st.ShareID = &id
		}
		claim.Status.Devices = append(claim.Status.Devices, st)
	}
	c.claims = append(c.claims, *claim)
	return alloc
}

func group(t *testing.T, v *seatview.View, node, device string) seatview.Group {
	t.Helper()
	for _, n := range v.Nodes {
		for _, g := range n.Groups {
			if n.Name == node && g.Device == device {
				return g
			}
		}
	}
	t.Fatalf("no group %s on %s", device, node)
	return seatview.Group{}
}

func TestSeatsOfANode(t *testing.T) {
	c := newCluster(t, draresources.LayoutShared, "node-a", "node-b")
	c.allocate("team-a", "pair", "gpu-2x-seat.kyb.ai", `device.attributes["gpu.kyb.ai"].group == "G01"`, "node-a", "trainer", []int{0})
	for i := range 4 {
		c.allocate("team-b", fmt.Sprintf("one-%d", i), "gpu-1x-seat.kyb.ai", `device.attributes["gpu.kyb.ai"].group == "G5"`, "node-a", fmt.Sprintf("pod-%d", i), []int{3 - i})
	}
	// Allocated, status not written yet.
	c.allocate("team-a", "fresh", "gpu-1x-seat.kyb.ai", `device.attributes["gpu.kyb.ai"].group == "G6"`, "node-a", "new", nil)

	v := seatview.Build(c.slices, c.claims, seatview.Options{})
	if len(v.Nodes) != 2 || v.Nodes[0].Name != "node-a" || len(v.Nodes[0].Groups) != 12 {
		t.Fatalf("nodes: %+v", v.Nodes)
	}
	pair := group(t, v, "node-a", "g01-2x")
	if pair.State != seatview.StateInUse || pair.HeldSeats != 1 || pair.Seats != 3 || len(pair.Held) != 1 ||
		*pair.Held[0].Seat != 0 || pair.Held[0].Claim != "team-a/pair" || pair.Held[0].Pods[0] != "team-a/trainer" || pair.Held[0].Generation != 10 {
		t.Errorf("g01-2x: %+v", pair)
	}
	for _, d := range []string{"g0-1x", "g1-1x"} {
		if g := group(t, v, "node-a", d); g.State != seatview.StateBlocked || strings.Join(g.BlockedBy, ",") != "g01-2x" {
			t.Errorf("%s: %s by %v, want blocked by g01-2x", d, g.State, g.BlockedBy)
		}
	}
	full := group(t, v, "node-a", "g5-1x")
	if full.State != seatview.StateFull || full.HeldSeats != 4 || *full.Held[0].Seat != 0 || full.Held[0].Claim != "team-b/one-3" {
		t.Errorf("g5-1x: %+v", full)
	}
	if g := group(t, v, "node-a", "g45-2x"); g.State != seatview.StateBlocked || strings.Join(g.BlockedBy, ",") != "g5-1x" {
		t.Errorf("g45-2x: %+v", g)
	}
	fresh := group(t, v, "node-a", "g6-1x")
	if fresh.State != seatview.StateInUse || len(fresh.Held) != 1 || fresh.Held[0].Seat != nil {
		t.Errorf("g6-1x, status not written yet: %+v", fresh)
	}
	if g := group(t, v, "node-b", "g01-2x"); g.State != seatview.StateFree || g.HeldSeats != 0 {
		t.Errorf("node-b's g01-2x: %+v", g)
	}
	// Free seats: node-a's 1x: G0, G1 blocked, G5 full, G6 has 3 left,
	// G2, G3, G4, G7 4 each: 19; node-b 32. 2x: node-a G01 2 left, G23 3,
	// G45 blocked, G67 blocked by G6; node-b 12.
	want := []seatview.ProfileSeats{{Profile: "1x", Free: 19 + 32, Total: 64}, {Profile: "2x", Free: 5 + 12, Total: 24}}
	if fmt.Sprint(v.Free) != fmt.Sprint(want) {
		t.Errorf("free seats %v, want %v", v.Free, want)
	}

	// One namespace: the others' holders count but are not named.
	v = seatview.Build(c.slices, c.claims, seatview.Options{Node: "node-a", Namespace: "team-a"})
	if len(v.Nodes) != 1 {
		t.Fatalf("--node node-a: %d nodes", len(v.Nodes))
	}
	if g := group(t, v, "node-a", "g5-1x"); g.HeldSeats != 4 || len(g.Held) != 0 || g.State != seatview.StateFull {
		t.Errorf("g5-1x seen from team-a: %+v", g)
	}
	var out strings.Builder
	if err := seatview.WriteTable(&out, v, false); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"g01-2x  G01    2x       0,1   3      1     in use              0: team-a/pair (team-a/trainer)",
		"g0-1x   G0     1x       0     4      0     blocked by g01-2x   -",
		"g5-1x   G5     1x       5     4      4     full                4 in other namespaces",
		"g6-1x   G6     1x       6     4      1     in use              ?: team-a/fresh (team-a/new)",
		"1x          19    32",
	} {
		// Columns are aligned by tabwriter: compare field by field.
		if !strings.Contains(squash(out.String()), squash(line)) {
			t.Errorf("table lacks %q:\n%s", line, out.String())
		}
	}
}

func TestUnhealthyAndPerSeatGroups(t *testing.T) {
	c := newCluster(t, draresources.LayoutPerSeat, "node-a")
	c.allocate("ns", "a", "gpu-2x-seat.kyb.ai", `device.attributes["gpu.kyb.ai"].group == "G23"`, "node-a", "p", nil)
	for i := range c.slices {
		for j := range c.slices[i].Spec.Devices {
			d := &c.slices[i].Spec.Devices[j]
			if strings.HasPrefix(d.Name, "g7-1x") {
				d.Taints = []resourceapi.DeviceTaint{{Key: "gpu.kyb.ai/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
			}
		}
	}
	v := seatview.Build(c.slices, c.claims, seatview.Options{})
	g := group(t, v, "node-a", "g23-2x")
	if g.Seats != 3 || g.HeldSeats != 1 || len(g.Held) != 1 || g.Held[0].Seat == nil || g.State != seatview.StateInUse {
		t.Errorf("per-seat g23-2x: %+v", g)
	}
	if g := group(t, v, "node-a", "g7-1x"); g.State != seatview.StateUnhealthy || g.Taints[0] != "gpu.kyb.ai/unhealthy=xid-79:NoSchedule" {
		t.Errorf("g7-1x: %+v", g)
	}
	var out strings.Builder
	if err := seatview.WriteJSON(&out, v); err != nil {
		t.Fatal(err)
	}
	// The documented contract's field names.
	for _, key := range []string{`"nodes"`, `"name": "node-a"`, `"groups"`, `"device": "g23-2x"`, `"group": "G23"`, `"profile": "2x"`, `"gpus": [`, `"seats": 3`, `"state": "in-use"`, `"held": [`, `"seat": `, `"claim": "ns/a"`, `"pods": [`, `"free": [`} {
		if !strings.Contains(out.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
}

func squash(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}
