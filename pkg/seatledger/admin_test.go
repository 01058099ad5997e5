package seatledger

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

func adminClaim(name, device string) *resourceapi.ResourceClaim {
	c := claim(name, device)
	c.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	return c
}

// A claim with admin access gets its group's GPUs for monitoring: no seat
// taken, not refused because the group is full or overlapped, and it
// keeps no ordinary claim off the group or the groups sharing its GPUs.
// The checkpoint says so, in its version 3.
func TestAdminAccessTakesNoSeatAndBlocksNothing(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	full := []*resourceapi.ResourceClaim{claim("a", "g0-1x", "g0-1x", "g0-1x", "g0-1x")}
	if res := reserve(r.ctx, l, full); res.Err != nil || len(res.Errs) != 0 {
		t.Fatalf("fill g0-1x: %v %v", res.Err, res.Errs)
	}
	monitorFull := adminClaim("monitor-full", "g0-1x")
	monitorPair := adminClaim("monitor-pair", "g23-2x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{monitorFull, monitorPair})
	if res.Err != nil || len(res.Errs) != 0 {
		t.Fatalf("admin access: %v %v", res.Err, res.Errs)
	}
	for _, c := range []*resourceapi.ResourceClaim{monitorFull, monitorPair} {
		dev := res.Entries[c.UID].Devices[0]
		if !dev.AdminAccess || len(dev.Seats) != 0 || len(dev.Generations) != 0 || len(dev.GPUs) == 0 || len(dev.GPUUUIDs) != len(dev.GPUs) {
			t.Errorf("%s: %+v", c.Name, dev)
		}
	}
	// Ordinary claims on the pair's GPUs and on the pair itself still fit.
	after := reserve(r.ctx, l, []*resourceapi.ResourceClaim{claim("on-gpu2", "g2-1x"), claim("pair", "g23-2x")})
	if err := after.Errs["uid-on-gpu2"]; err != nil {
		t.Errorf("a 1x seat on a GPU that only a monitor has: %v", err)
	}
	// g23-2x overlaps g2-1x, which on-gpu2 now holds: refused for that
	// reason, not for the monitor.
	if err := after.Errs["uid-pair"]; err == nil {
		t.Error("g23-2x was handed out while g2-1x is held")
	}
	if held := r.lastHeld(); held["g0-1x"] != 4 || held["g23-2x"] != 0 || held["g2-1x"] != 1 {
		t.Errorf("held %v: admin access must count no seat", held)
	}
	if v := checkpointVersion(t, r.dir); v != checkpoint.V3 {
		t.Errorf("checkpoint version %s, want %s (it holds admin access)", v, checkpoint.V3)
	}
	// Released, the version goes back to the oldest that holds the state.
	errs, err := l.Release(r.ctx, []types.UID{monitorFull.UID, monitorPair.UID})
	if err != nil || errs[monitorFull.UID] != nil || errs[monitorPair.UID] != nil {
		t.Fatal(err, errs)
	}
	if v := checkpointVersion(t, r.dir); v != checkpoint.V1 {
		t.Errorf("checkpoint version after release %s, want %s", v, checkpoint.V1)
	}
}

// checkpointVersion is the version of the checkpoint file in dir.
func checkpointVersion(t *testing.T, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, checkpoint.FileName))
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		t.Fatal(err)
	}
	return head.Version
}

// After the checkpoint is lost, a claim with admin access comes back as
// such, from its allocation alone (it holds no seat to recover), whether
// its status was written or not, and its spec on disk agrees.
func TestAdminAccessSurvivesALostCheckpoint(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	monitor := adminClaim("monitor", "g0-1x")
	seat := claim("seat", "g0-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{monitor, seat})
	if res.Err != nil || len(res.Errs) != 0 {
		t.Fatal(res.Err, res.Errs)
	}
	for _, c := range []*resourceapi.ResourceClaim{monitor, seat} {
		if err := r.specs.Write(c.UID, res.Entries[c.UID]); err != nil {
			t.Fatal(err)
		}
	}
	r.store(monitor) // its status not written yet
	r.store(seat)
	l = r.loseCheckpoint(l)
	got := reserve(r.ctx, l, []*resourceapi.ResourceClaim{monitor, seat})
	if got.Err != nil || len(got.Errs) != 0 || got.Fresh[monitor.UID] {
		t.Fatal(got.Err, got.Errs, got.Fresh)
	}
	if dev := got.Entries[monitor.UID].Devices[0]; !dev.AdminAccess || dev.Fenced || len(dev.Seats) != 0 {
		t.Errorf("the monitor after the rebuild: %+v", dev)
	}
	if dev := got.Entries[seat.UID].Devices[0]; dev.Fenced || len(dev.Seats) != 1 || dev.Seats[0] != 0 {
		t.Errorf("the seat after the rebuild: %+v", dev)
	}
	if fenced := r.lastUsage().Fenced; len(fenced) != 0 {
		t.Errorf("fenced %v after a clean rebuild", fenced)
	}
}
