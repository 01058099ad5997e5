package seatledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint/checkpointtest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// Whatever a claim's status says, a rebuild never panics and never
// records a state that does not validate; a claim it does record either
// holds seats of the group its allocation names or is fenced.
func FuzzRebuildFromStatus(f *testing.F) {
	f.Add(`{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":["X"],"seats":[1],"generations":[3]}`, `{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":["X"],"seats":[1],"generations":[4]}`)
	f.Add(`{"seats":[0,0],"generations":[1]}`, `{"seats":[-1],"generations":[1,2]}`)
	f.Add(`{"profile":"2x","group":"G01","gpus":[0,1],"gpuUUIDs":["X","Y"],"seats":[9999999999],"generations":[-5]}`, `null`)
	_, inv := simnodetest.Inventory(f, "dgx-h100", "node-1")
	uuid := inv.GPUs[0].UUID
	f.Fuzz(func(t *testing.T, a, b string) {
		r := newRig(t, "dgx-h100", fourSeats)
		l := r.open()
		reserve(r.ctx, l, []*resourceapi.ResourceClaim{claim("seed", "g7-1x")})
		l.Close(r.ctx)
		checkpointtest.Truncate(t, r.dir)
		r.client = fake.NewClientset()
		r.opts.Claims = r.client.ResourceV1()
		for i, data := range []string{a, b} {
			c := claim(fmt.Sprintf("c%d", i), "g0-1x")
			res := c.Status.Allocation.Devices.Results[0]
			share := string(*res.ShareID)
			// The API server stores JSON only; "X" stands for GPU 0's UUID.
			raw := []byte(strings.ReplaceAll(data, `"X"`, `"`+uuid+`"`))
			if !json.Valid(raw) {
				raw, _ = json.Marshal(data)
			}
			// Compact, as the API server stores it (the fake client's
			// field tracking panics on a top-level value after spaces).
			var compact bytes.Buffer
			if err := json.Compact(&compact, raw); err == nil {
				raw = compact.Bytes()
			}
			c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{
				Driver: driver.Name, Pool: res.Pool, Device: res.Device, ShareID: &share, Data: &runtime.RawExtension{Raw: raw},
			}}
			if _, err := r.client.ResourceV1().ResourceClaims("default").Create(r.ctx, c, metav1.CreateOptions{}); err != nil {
				return // not a status the API server would hold
			}
		}
		l, err := Open(r.ctx, r.opts)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer l.Close(r.ctx)
		st, _, err := checkpoint.NewStore(r.dir).Load()
		if err != nil {
			t.Fatalf("the rebuilt checkpoint: %v", err)
		}
		for uid, c := range st.Claims {
			for _, d := range c.Devices {
				if !d.Fenced && (d.GroupDevice != "g0-1x" || d.Group != "G0") {
					t.Errorf("claim %s holds %+v, not a seat of G0", uid, d)
				}
			}
		}
		// A new claim on the group never gets a seat a recorded claim holds.
		n := claim("new", "g0-1x")
		res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{n})
		if res.Errs[n.UID] == nil {
			seat := res.Entries[n.UID].Devices[0].Seats[0]
			for _, uid := range []types.UID{"uid-c0", "uid-c1"} {
				if c := st.Claims[uid]; c != nil && len(c.Devices) > 0 && !c.Devices[0].Fenced && c.Devices[0].Seats[0] == seat {
					t.Errorf("the new claim got seat %d, which %s holds", seat, uid)
				}
			}
		}
	})
}
