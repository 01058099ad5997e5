package seatledger

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// An H200 has 143771 MiB per GPU: 140.4 GiB.
const sized = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 4
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 4
  sharing: {strategy: mps, sized: true}
`

const gib = int64(1) << 30

// sizedClaim is a claim whose results consumed sizes as the allocator
// writes them: "memory=60Gi,compute=25" per device ("" consumes nothing
// the result names: an allocation written by hand).
func sizedClaim(name string, devices map[string]string) *resourceapi.ResourceClaim {
	var names []string
	for d := range devices {
		names = append(names, d)
	}
	c := claim(name, names...)
	for i := range c.Status.Allocation.Devices.Results {
		r := &c.Status.Allocation.Devices.Results[i]
		if devices[r.Device] == "" {
			continue
		}
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
		for _, kv := range strings.Split(devices[r.Device], ",") {
			k, v, _ := strings.Cut(kv, "=")
			r.ConsumedCapacity[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	return c
}

func sizeOfEntry(t *testing.T, res reserved, uid types.UID) v1alpha1.SeatSize {
	t.Helper()
	e := res.Entries[uid]
	if e == nil || len(e.Devices) != 1 || e.Devices[0].Size == nil {
		t.Fatalf("%s: entry %+v, refused: %v", uid, e, res.Errs[uid])
	}
	return *e.Devices[0].Size
}

func TestSizedSeatsRecordWhatTheirAllocationConsumed(t *testing.T) {
	r := newRig(t, "dgx-h200", sized)
	l := r.open()
	a := sizedClaim("a", map[string]string{"g0-1x-sized": "seats=1,memory=60Gi,compute=25"})
	b := sizedClaim("b", map[string]string{"g0-1x-sized": "seats=1,memory=20Gi,compute=50"})
	byHand := sizedClaim("by-hand", map[string]string{"g0-1x-sized": ""})
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a, b, byHand})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	for uid, want := range map[types.UID]v1alpha1.SeatSize{
		a.UID: {MemoryBytes: 60 * gib, ComputePercent: 25},
		b.UID: {MemoryBytes: 20 * gib, ComputePercent: 50},
		// The defaults: a quarter of 140.4 GiB in whole GiB, 25 %.
		byHand.UID: {MemoryBytes: 35 * gib, ComputePercent: 25},
	} {
		if got := sizeOfEntry(t, res, uid); got != want {
			t.Errorf("%s holds %+v, want %+v", uid, got, want)
		}
	}
	if got := seatsOf(res.Entries[b.UID]); len(got) != 1 || len(got[0]) != 1 || got[0][0] != 1 {
		t.Errorf("b holds seats %v, want [[1]]: a sized claim takes one seat", got)
	}
	u := r.lastUsage()
	if want := (v1alpha1.SeatSize{MemoryBytes: 60 * gib, ComputePercent: 50}); u.Sizes["g0-1x-sized"] != want {
		t.Errorf("the largest size held %+v, want %+v (memory and compute each the most one claim holds)", u.Sizes["g0-1x-sized"], want)
	}
	if u.Held["g0-1x-sized"] != 3 || u.Largest["g0-1x-sized"] != 0 {
		t.Errorf("held %v, largest %v: want 3 seats held and no equal share", u.Held, u.Largest)
	}
	if got := u.InUse(); len(got) != 1 || got[0] != "g0-1x-sized" {
		t.Errorf("in use %v", got)
	}
	if _, err := l.Release(r.ctx, []types.UID{a.UID}); err != nil {
		t.Fatal(err)
	}
	if want := (v1alpha1.SeatSize{MemoryBytes: 35 * gib, ComputePercent: 50}); r.lastUsage().Sizes["g0-1x-sized"] != want {
		t.Errorf("after a's release the largest size %+v, want %+v", r.lastUsage().Sizes["g0-1x-sized"], want)
	}
}

// The scheduler's allocator keeps a group's shares within what it
// publishes; two schedulers, or an allocation written by hand, may not.
// The node refuses the claim that would pass it, and only that claim.
func TestASizedClaimBeyondWhatTheGroupPublishesIsRefusedAlone(t *testing.T) {
	r := newRig(t, "dgx-h200", sized)
	l := r.open()
	first := sizedClaim("first", map[string]string{"g0-1x-sized": "memory=100Gi,compute=40"})
	second := sizedClaim("second", map[string]string{"g0-1x-sized": "memory=60Gi,compute=40"})
	sms := sizedClaim("sms", map[string]string{"g0-1x-sized": "memory=10Gi,compute=61"})
	fits := sizedClaim("fits", map[string]string{"g0-1x-sized": "memory=40Gi,compute=60"})
	other := sizedClaim("other", map[string]string{"g1-1x-sized": "memory=100Gi,compute=40"})
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{first, second, sms, fits, other})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	for uid, msg := range map[types.UID]string{
		second.UID: "prepare claim default/second (uid-second): group G0: 60Gi of memory per GPU and 40 % of compute, beside the 100Gi and 40 % held there, are more than the group has (143771Mi, 100 %)",
		sms.UID:    "group G0: 10Gi of memory per GPU and 61 % of compute, beside the 100Gi and 40 % held there",
	} {
		if err := res.Errs[uid]; err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want %q", uid, err, msg)
		}
		if res.Entries[uid] != nil {
			t.Errorf("%s was recorded although refused", uid)
		}
	}
	for _, ok := range []types.UID{first.UID, fits.UID, other.UID} {
		if res.Errs[ok] != nil || !res.Fresh[ok] {
			t.Errorf("%s: %v", ok, res.Errs[ok])
		}
	}
}

func TestASizeTheAllocatorCouldNotHaveGivenIsRefused(t *testing.T) {
	r := newRig(t, "dgx-h200", sized)
	l := r.open()
	tests := map[string]string{
		"off-step":  "memory=1536Mi: consumed memory 1536Mi is not a size the group offers",
		"two-seats": "seats=2: consumed seats 2: a sized seat's claim takes exactly one seat",
		"no-memory": "memory=0: consumed memory 0 is not a size the group offers",
	}
	for name, want := range tests {
		consumed, msg, _ := strings.Cut(want, ": ")
		c := sizedClaim(name, map[string]string{"g0-1x-sized": consumed})
		res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
		if err := res.Errs[c.UID]; err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want %q", name, err, msg)
		}
	}
}

func TestTwoSizedSeatsOfOneClaimOnAGroupAddUp(t *testing.T) {
	r := newRig(t, "dgx-h200", sized)
	l := r.open()
	c := claim("pair", "g01-2x-sized", "g01-2x-sized")
	for i := range c.Status.Allocation.Devices.Results {
		c.Status.Allocation.Devices.Results[i].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			"seats": resource.MustParse("1"), "memory": resource.MustParse("80Gi"), "compute": resource.MustParse("30"),
		}
	}
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
	if err := res.Errs[c.UID]; err == nil || !strings.Contains(err.Error(), "80Gi of memory per GPU and 30 % of compute, beside the 80Gi and 30 % held there") {
		t.Errorf("a claim's second 80Gi on a group of 140.4Gi per GPU: %v, want it refused, its first share counted", err)
	}
	c = claim("pair-2", "g01-2x-sized", "g01-2x-sized")
	for i := range c.Status.Allocation.Devices.Results {
		c.Status.Allocation.Devices.Results[i].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse("40Gi"), "compute": resource.MustParse("30"),
		}
	}
	res = reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
	if res.Errs[c.UID] != nil {
		t.Fatal(res.Errs[c.UID])
	}
	if want := (v1alpha1.SeatSize{MemoryBytes: 80 * gib, ComputePercent: 60}); r.lastUsage().Sizes["g01-2x-sized"] != want {
		t.Errorf("the claim's size on the group %+v, want its two seats added up, %+v", r.lastUsage().Sizes["g01-2x-sized"], want)
	}
}

func TestALostCheckpointRebuildsSizesFromTheAllocation(t *testing.T) {
	r := newRig(t, "dgx-h200", sized)
	l := r.open()
	a := sizedClaim("a", map[string]string{"g0-1x-sized": "seats=1,memory=60Gi,compute=25"})
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a})
	dev := res.Entries[a.UID].Devices[0]
	// The status records another size: the allocation decides.
	r.store(a, `{"profile":"1x-sized","group":"G0","gpus":[0],"gpuUUIDs":["`+dev.GPUUUIDs[0]+`"],"seats":[0],"generations":[1],"size":{"memoryBytes":1,"computePercent":1}}`)
	l = r.loseCheckpoint(l)
	got := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a})
	if got.Fresh[a.UID] {
		t.Fatal("a was prepared afresh after the rebuild")
	}
	if size := sizeOfEntry(t, got, a.UID); size != (v1alpha1.SeatSize{MemoryBytes: 60 * gib, ComputePercent: 25}) {
		t.Errorf("rebuilt size %+v, want the allocation's 60Gi and 25 %%", size)
	}
	if want := (v1alpha1.SeatSize{MemoryBytes: 60 * gib, ComputePercent: 25}); r.lastUsage().Sizes["g0-1x-sized"] != want {
		t.Errorf("usage after the rebuild %+v", r.lastUsage().Sizes)
	}
}
