package seatview_test

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

func TestMIGSeatsShowProfilePlacementAndInstance(t *testing.T) {
	c := &cluster{t: t, sched: schedulertest.New(schedulertest.SchedulerFeatures())}
	sn := simnodetest.New(t, "dgx-h100", `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 4}, gpus: [0]}
`)
	res := draresources.Resources(sn.Plan, sn.Inv, "node-a", draresources.LayoutShared)
	c.sched.AddNode("node-a", res, driver.Name)
	for _, s := range draresources.ResourceSlices(res, "node-a") {
		c.slices = append(c.slices, *s)
	}
	c.sched.AddClasses(draresources.DeviceClasses(sn.Plan.Profiles, draresources.DeviceClassOptions{})...)
	// An administrator's instance at {0}:1, published as a static seat.
	for i := range c.slices {
		for j := range c.slices[i].Spec.Devices {
			if d := &c.slices[i].Spec.Devices[j]; d.Name == "g0-mig-1g-10gb-0" {
				d.Attributes["static"] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
			}
		}
	}

	// A claim whose status the plugin has written, with its MIG device,
	// and one allocated a moment ago.
	migClaim := func(name string, start int, status string) {
		t.Helper()
		claim := schedulertest.Claim(name, "mig-1g.10gb.kyb.ai", 1,
			schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].placementStart == `+string(rune('0'+start))))
		claim.Namespace = "team-a"
		alloc, err := c.sched.Allocate(context.Background(), claim, "node-a")
		if err != nil || alloc == nil {
			t.Fatalf("allocate %s: %v %v", name, alloc, err)
		}
		claim.Status.Allocation = alloc
		claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-pod", UID: types.UID(name)}}
		if status != "" {
			r := alloc.Devices.Results[0]
			claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: r.Driver, Pool: r.Pool, Device: r.Device, Data: &runtime.RawExtension{Raw: []byte(status)}}}
		}
		c.claims = append(c.claims, *claim)
	}
	migClaim("small", 6, `{"profile":"mig-1g-10gb","group":"G0","gpus":[0],"gpuUUIDs":["GPU-0"],"seats":[6],"generations":[1],"migDeviceUUID":"MIG-11111111-2222-3333-4444-555555555555"}`)
	migClaim("fresh", 5, "")

	v := seatview.Build(c.slices, c.claims, seatview.Options{})
	small := group(t, v, "node-a", "g0-mig-1g-10gb-6")
	if small.MIG == nil || *small.MIG != (seatview.MIGInstance{Profile: "1g.10gb", PlacementStart: 6, PlacementSize: 1}) ||
		small.Seats != 1 || small.State != seatview.StateFull || len(small.Held) != 1 ||
		small.Held[0].MIGDeviceUUID != "MIG-11111111-2222-3333-4444-555555555555" || *small.Held[0].Seat != 6 {
		t.Errorf("g0-mig-1g-10gb-6: %+v, MIG %+v", small, small.MIG)
	}
	if g := group(t, v, "node-a", "g1-1x"); g.MIG != nil {
		t.Errorf("a whole-GPU group is no MIG device: %+v", g.MIG)
	}

	var out strings.Builder
	if err := seatview.WriteTable(&out, v, false); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"DEVICE GROUP PROFILE MIG GPUS SEATS HELD STATE HELD BY",
		"g0-mig-1g-10gb-6 G0 mig-1g-10gb 1g.10gb {6}:1 0 1 1 full 6: team-a/small (team-a/small-pod) MIG-11111111-2222-3333-4444-555555555555",
		"g0-mig-1g-10gb-5 G0 mig-1g-10gb 1g.10gb {5}:1 0 1 1 full ?: team-a/fresh (team-a/fresh-pod) -",
		"g0-mig-1g-10gb-4 G0 mig-1g-10gb 1g.10gb {4}:1 0 1 0 free -",
		"g0-mig-1g-10gb-0 G0 mig-1g-10gb 1g.10gb {0}:1 static 0 1 0 free -",
		"g1-1x G1 1x - 1 1 0 free -",
		// The GPU's whole-GPU group does not fit beside its instances;
		// instances beside each other fit until the GPU's 4 seats are
		// taken.
		"g0-1x G0 1x - 0 1 0 blocked by g0-mig-1g-10gb-5,g0-mig-1g-10gb-6 -",
		"mig-1g-10gb 2 4",
		"1x 7 8",
	} {
		if !strings.Contains(squash(out.String()), line) {
			t.Errorf("table lacks %q:\n%s", line, out.String())
		}
	}
	out.Reset()
	if err := seatview.WriteJSON(&out, v); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"mig": {`, `"profile": "1g.10gb"`, `"placementStart": 6`, `"placementSize": 1`, `"migDeviceUUID": "MIG-11111111-2222-3333-4444-555555555555"`} {
		if !strings.Contains(out.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
}
