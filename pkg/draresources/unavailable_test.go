package draresources_test

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

func TestUnavailableGroups(t *testing.T) {
	n := newNode(t, "dgx-h100", "", draresources.LayoutShared)
	// g0-1x held: the 2x and 4x groups on GPU 0 are blocked, nothing else.
	got := draresources.Blocked(n.plan, []string{"g0-1x"})
	want := map[string]bool{"g01-2x": true, "g0123-4x": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("blocked by g0-1x: %v, want %v", got, want)
	}
	// A held 2x group blocks its two 1x groups and its 4x group.
	got = draresources.Blocked(n.plan, []string{"g23-2x"})
	want = map[string]bool{"g2-1x": true, "g3-1x": true, "g0123-4x": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("blocked by g23-2x: %v, want %v", got, want)
	}
	// Two held groups that overlap (a stale state) stay published both.
	got = draresources.Blocked(n.plan, []string{"g0-1x", "g01-2x"})
	if got["g0-1x"] || got["g01-2x"] || !got["g1-1x"] {
		t.Errorf("overlapping held groups: %v; held groups must never be hidden", got)
	}

	res := draresources.Resources(n.plan, n.inv, "node-1", draresources.LayoutShared)
	before := len(res.Pools["node-1"].Slices)
	// g0-1x has one seat: held, it is full, and stays published: only the
	// groups it blocks go.
	if hidden := draresources.HideBlocked(res, n.plan, draresources.Held{"g0-1x": 1}); hidden != 2 {
		t.Errorf("hid %d devices, want 2", hidden)
	}
	if len(res.Pools["node-1"].Slices) != before {
		t.Errorf("hiding changed the slice count: %d, was %d", len(res.Pools["node-1"].Slices), before)
	}
	published := map[string]bool{}
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			published[d.Name] = true
		}
	}
	if published["g01-2x"] || published["g0123-4x"] || !published["g0-1x"] {
		t.Errorf("with g0-1x held and full: published %v; the blocked g01-2x and g0123-4x go, the full g0-1x stays", published)
	}

	over := newNode(t, "dgx-h100", `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, allowOverprovision: true}
- {resource: kyb.ai/gpu-2x-seat}
`, draresources.LayoutShared)
	if got := draresources.Blocked(over.plan, []string{"g0-1x", "g23-2x"}); len(got) != 0 {
		t.Errorf("overprovisioned 1x groups neither block nor are blocked: %v", got)
	}
	// A full shared group is never hidden: its allocations count.
	res = draresources.Resources(over.plan, over.inv, "node-1", draresources.LayoutShared)
	if hidden := draresources.HideBlocked(res, over.plan, draresources.Held{"g0-1x": 4}); hidden != 0 {
		t.Errorf("full overprovisioned g0-1x: %d devices hidden, want none", hidden)
	}
}

// Hiding blocked groups (hideBlocked) must change what the scheduler
// costs, never what it decides. Two clusters of one node see the same
// random claims and releases: one publishes every group, the other
// republishes without the blocked groups after every change, as the
// plugin does after every prepare and unprepare with hideBlocked. The scheduler's allocator must give every claim
// the same device on both (or refuse it on both), and no two groups in use
// may share a GPU.
func TestHidingBlockedGroupsChangesNoDecision(t *testing.T) {
	configs := map[string]string{
		"defaults":        "",
		"seed":            "seed",
		"overprovisioned": "profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, allowOverprovision: true}\n- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 2}\n- {resource: kyb.ai/gpu-4x-seat}\n",
		"spread":          "allocationPolicy: spread\nprofiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 3}\n- {resource: kyb.ai/gpu-2x-seat}\n- {resource: kyb.ai/gpu-4x-seat}\n- {resource: kyb.ai/gpu-8x-seat}\n",
	}
	for name, config := range configs {
		for _, preset := range []string{"dgx-h100", "pcie-8gpu"} {
			t.Run(name+"/"+preset, func(t *testing.T) {
				all := newNode(t, preset, config, draresources.LayoutShared)
				lean := newNode(t, preset, config, draresources.LayoutShared)
				var classes []string
				for _, p := range all.plan.Profiles {
					classes = append(classes, draresources.DeviceClassName(p.Resource))
				}
				rng := rand.New(rand.NewSource(1))
				var inUse []inUseGroup
				republish := func() {
					res := draresources.Resources(lean.plan, lean.inv, "node-1", draresources.LayoutShared)
					draresources.HideBlocked(res, lean.plan, heldOf(inUse))
					lean.cluster.SetNode("node-1", res, driver.Name)
				}
				placed, refused, blockedSeen, fullSeen := 0, 0, false, false
				for i := 0; i < 400; i++ {
					if len(inUse) > 0 && rng.Intn(3) == 0 {
						k := rng.Intn(len(inUse))
						all.cluster.Release(inUse[k].everything)
						lean.cluster.Release(inUse[k].result)
						inUse = slices.Delete(inUse, k, k+1)
						republish()
						continue
					}
					class := classes[rng.Intn(len(classes))]
					claim := schedulertest.Claim(fmt.Sprintf("c%d", i), class, 1)
					a, err := all.cluster.Allocate(ctx, claim, "node-1")
					if err != nil {
						t.Fatal(err)
					}
					b, err := lean.cluster.Allocate(ctx, claim, "node-1")
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case (a == nil) != (b == nil):
						t.Fatalf("claim %d (%s): publishing every group gives %v, hiding blocked groups %v", i, class, a, b)
					case a == nil:
						refused++
						continue
					case a.Devices.Results[0].Device != b.Devices.Results[0].Device:
						t.Fatalf("claim %d (%s): device %s with every group published, %s with blocked groups hidden", i, class, a.Devices.Results[0].Device, b.Devices.Results[0].Device)
					}
					placed++
					inUse = append(inUse, inUseGroup{everything: a, result: b, device: b.Devices.Results[0].Device})
					for _, h := range inUse {
						g := lean.plan.GroupByDevice(h.device)
						for _, o := range inUse {
							if g.Excludes(lean.plan.GroupByDevice(o.device)) {
								t.Fatalf("groups %s and %s share a GPU and are both in use", h.device, o.device)
							}
						}
					}
					republish()
					held := heldOf(inUse)
					blocked := draresources.Blocked(lean.plan, held.Devices())
					blockedSeen = blockedSeen || len(blocked) > 0
					for _, g := range lean.plan.Groups() {
						fullSeen = fullSeen || (held[g.DeviceName()] >= g.Seats() && !blocked[g.DeviceName()])
					}
				}
				if placed < 50 || refused < 20 || !blockedSeen || !fullSeen {
					t.Errorf("the run proves little: %d placed, %d refused, blocked groups seen: %t, full groups seen: %t", placed, refused, blockedSeen, fullSeen)
				}
			})
		}
	}
}

// inUseGroup is an allocated claim and the group device it holds.
type inUseGroup struct {
	// everything and result are the claim's allocations on the node that
	// publishes every group and on the one that hides blocked groups.
	everything, result *resourceapi.AllocationResult
	device             string
}

func heldOf(in []inUseGroup) draresources.Held {
	out := draresources.Held{}
	for _, h := range in {
		out[h.device]++
	}
	return out
}
