package seatledger

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint/checkpointtest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// store puts c into the fake API server with status data per device
// (raw JSON; a device without one has none).
func (r *rig) store(c *resourceapi.ResourceClaim, data ...string) {
	r.t.Helper()
	c = c.DeepCopy()
	for i, raw := range data {
		res := c.Status.Allocation.Devices.Results[i]
		share := string(*res.ShareID)
		c.Status.Devices = append(c.Status.Devices, resourceapi.AllocatedDeviceStatus{
			Driver: driver.Name, Pool: res.Pool, Device: res.Device, ShareID: &share, Data: &runtime.RawExtension{Raw: []byte(raw)},
		})
	}
	if _, err := r.client.ResourceV1().ResourceClaims(c.Namespace).Create(r.ctx, c, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// statusOf is the status data the plugin writes for a device's entry.
func statusOf(d checkpoint.Device) string {
	return fmt.Sprintf(`{"profile":%q,"group":%q,"gpus":%s,"gpuUUIDs":%s,"seats":%s,"generations":%s}`,
		d.Profile, d.Group, jsonList(d.GPUs), jsonStrings(d.GPUUUIDs), jsonList(d.Seats), jsonList(d.Generations))
}

func jsonList[T int | int64](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ",") + "]"
}

func jsonStrings(xs []string) string { return `["` + strings.Join(xs, `","`) + `"]` }

// loseCheckpoint closes the ledger, damages both copies of its checkpoint
// and opens it again: it rebuilds.
func (r *rig) loseCheckpoint(l *Ledger) *Ledger {
	r.t.Helper()
	l.Close(r.ctx)
	checkpointtest.Truncate(r.t, r.dir)
	l = r.open()
	if l.Lost() {
		r.t.Fatal("the ledger is lost although the API server answers")
	}
	return l
}

func (r *rig) events(reason string) []string {
	r.t.Helper()
	list, err := r.client.EventsV1().Events("").List(r.ctx, metav1.ListOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

// The claim whose status was not written yet (statuses go out a second
// after the prepare, and not at all while the API server fails) is
// recovered from its CDI spec: a new claim does not get its seat.
func TestRebuildRecoversSeatsFromTheSpecsWhenStatusesLag(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	r.opts.Events = nodeevents.Start(r.ctx, r.client, "node-1", driver.Name)
	l := r.open()
	a, b := claim("a", "g0-1x"), claim("b", "g0-1x", "g0-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a, b})
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		if err := r.specs.Write(c.UID, res.Entries[c.UID]); err != nil {
			t.Fatal(err)
		}
	}
	r.store(a, statusOf(res.Entries[a.UID].Devices[0])) // a's status was written
	r.store(b)                                          // b's was not
	l = r.loseCheckpoint(l)
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		got := reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
		if got.Fresh[c.UID] || !slices.EqualFunc(seatsOf(got.Entries[c.UID]), seatsOf(res.Entries[c.UID]), slices.Equal) {
			t.Errorf("%s after the rebuild: fresh %v, seats %v; want its seats %v", c.Name, got.Fresh[c.UID], seatsOf(got.Entries[c.UID]), seatsOf(res.Entries[c.UID]))
		}
	}
	n := claim("new", "g0-1x")
	if got := seatsOf(reserve(r.ctx, l, []*resourceapi.ResourceClaim{n}).Entries[n.UID]); !slices.EqualFunc(got, [][]int{{3}}, slices.Equal) {
		t.Errorf("a new claim got %v, want seat 3: seats 0 to 2 are held", got)
	}
	if fenced := r.lastUsage().Fenced; len(fenced) != 0 {
		t.Errorf("fenced %v after a clean rebuild", fenced)
	}
}

// Records that do not fit the claim's allocation or the node are not
// used: the claim is fenced and reported, and no seat of its group is
// handed out until it is released.
func TestRebuildFencesRecordsThatCannotBeTrusted(t *testing.T) {
	good := `{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":["%s"],"seats":[0],"generations":[1]}`
	tests := []struct {
		name, status string
		spec         bool // the claim's spec stays on disk
		why          string
	}{
		{name: "seat out of range", status: `{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":["%s"],"seats":[7],"generations":[1]}`, why: "seat 7 is not one of group G0's 4 seats"},
		{name: "negative seat", status: `{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":["%s"],"seats":[-1],"generations":[1]}`, why: "seat -1 is not one of group G0's 4 seats"},
		{name: "GPUs of another group", status: `{"profile":"1x","group":"G0","gpus":[1],"gpuUUIDs":["%s"],"seats":[0],"generations":[1]}`, why: "but group G0 is GPUs [0]"},
		{name: "seats and generations of different lengths", status: `{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":["%s"],"seats":[0],"generations":[]}`, why: "records 1 seats and 0 generations"},
		{name: "another group", status: `{"profile":"1x","group":"G1","gpus":[0],"gpuUUIDs":["%s"],"seats":[0],"generations":[1]}`, why: "it names group G1 (1x), but the device is group G0"},
		{name: "data that does not decode", status: `{"seats":"zero","gpuUUIDs":["%s"]}`, why: "does not decode"},
		{name: "status and spec disagree", status: `{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":["%s"],"seats":[2],"generations":[1]}`, spec: true, why: "its status and its CDI spec give it different seats"},
		{name: "a seat recorded for two claims", status: good, why: "seat 0 of group G0 is recorded for it and for claim default/other"},
		// A generation near the largest int64 would overflow when the
		// floor is raised past it.
		{name: "a generation past the bound", status: `{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":["%s"],"seats":[0],"generations":[9223372036854775807]}`, why: "seat 0 has generation 9223372036854775807, not between 1 and"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, "dgx-h100", fourSeats)
			r.opts.Events = nodeevents.Start(r.ctx, r.client, "node-1", driver.Name)
			l := r.open()
			c := claim("c", "g0-1x")
			res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
			if tt.spec {
				if err := r.specs.Write(c.UID, res.Entries[c.UID]); err != nil {
					t.Fatal(err)
				}
			}
			r.store(c, fmt.Sprintf(tt.status, r.opts.Inventory.GPUs[0].UUID))
			if tt.name == "a seat recorded for two claims" {
				r.store(claim("other", "g0-1x"), fmt.Sprintf(good, r.opts.Inventory.GPUs[0].UUID))
			}
			l = r.loseCheckpoint(l)
			got := reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
			if err := got.Errs[c.UID]; err == nil || !strings.Contains(err.Error(), "could not be recovered after the plugin's checkpoint was lost") {
				t.Errorf("a prepare of the fenced claim: %v", err)
			}
			n := claim("new", "g0-1x")
			if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{n}).Errs[n.UID]; err == nil || !strings.Contains(err.Error(), "fenced") || !strings.Contains(err.Error(), "claim default/c (uid-c)") {
				t.Errorf("a new claim on the fenced group: %v", err)
			}
			overlap := claim("pair", "g01-2x")
			if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{overlap}).Errs[overlap.UID]; err == nil {
				t.Error("a new claim on a group sharing the fenced GPU was prepared")
			}
			elsewhere := claim("elsewhere", "g4-1x")
			if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{elsewhere}).Errs[elsewhere.UID]; err != nil {
				t.Errorf("a claim on another GPU: %v", err)
			}
			u := r.lastUsage()
			if u.Fenced[0] != FenceSeatsUnknown || u.Held["g0-1x"] != 4 {
				t.Errorf("usage %+v: GPU 0 must be fenced (seats unknown) and g0-1x full", u)
			}
			var why []string
			waitFor(t, func() bool { why = r.events(nodeevents.ReasonGPUsFenced); return len(why) > 0 })
			if !strings.Contains(why[0], "could not be recovered after the plugin's checkpoint was lost") {
				t.Errorf("GPUsFenced event: %q", why[0])
			}
			if !strings.Contains(strings.Join(logged(t, r), "\n"), tt.why) {
				t.Errorf("no log says %q", tt.why)
			}
			// The release lifts the fence.
			if _, err := l.Release(r.ctx, []types.UID{c.UID, "uid-other"}); err != nil {
				t.Fatal(err)
			}
			if u := r.lastUsage(); len(u.Fenced) != 0 {
				t.Errorf("fenced %v after the release", u.Fenced)
			}
			if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{n}).Errs[n.UID]; err != nil {
				t.Errorf("a new claim after the release: %v", err)
			}
		})
	}
}

// logged is what the ledger logged so far, line by line.
func logged(t *testing.T, r *rig) []string {
	t.Helper()
	return strings.Split(r.logger.GetSink().(ktesting.Underlier).GetBuffer().String(), "\n")
}

// waitFor polls ok for up to 10 s.
func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A configuration that redefines a held group (same name, other GPUs)
// must not let a new group onto the GPUs the held claim still uses: they
// stay fenced, judged by the GPUs recorded for the claim, until it is
// released.
func TestRedefinedHeldGroupFencesItsRecordedGPUs(t *testing.T) {
	// Named groups only, so that G01 may name other GPUs than 0 and 1.
	const ones = "grouping: explicit\ngroups:\n- {name: G0, gpus: [0]}\n- {name: G1, gpus: [1]}\n- {name: G2, gpus: [2]}\n- {name: G3, gpus: [3]}\n"
	const before = fourSeats + ones + "- {name: G01, gpus: [0, 1]}\n"
	const after = fourSeats + ones + "- {name: G01, gpus: [2, 3]}\n"
	r := newRig(t, "dgx-h100", before)
	r.opts.Events = nodeevents.Start(r.ctx, r.client, "node-1", driver.Name)
	l := r.open()
	held := claim("held", "g01-2x")
	if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{held}).Errs[held.UID]; err != nil {
		t.Fatal(err)
	}
	l.Close(r.ctx)
	r.opts.Plan = simnodetest.New(t, "dgx-h100", after).Plan
	l = r.open()

	u := r.lastUsage()
	if u.Fenced[0] != FenceEarlierConfiguration || u.Fenced[1] != FenceEarlierConfiguration || len(u.Fenced) != 2 {
		t.Errorf("fenced %v, want GPUs 0 and 1 (earlier configuration)", u.Fenced)
	}
	var notes []string
	waitFor(t, func() bool { notes = r.events(nodeevents.ReasonGPUsFenced); return len(notes) > 0 })
	if want := "holds group G01 on GPUs 0,1 as an earlier configuration defined it; the configuration now defines it on GPUs 2,3"; !strings.Contains(notes[0], want) {
		t.Errorf("event %q, want it to say %q", notes[0], want)
	}
	onHeldGPU := claim("one", "g0-1x")
	if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{onHeldGPU}).Errs[onHeldGPU.UID]; err == nil || !strings.Contains(err.Error(), "are fenced by claim default/held (uid-held), which holds them through group G01 (GPUs 0,1) with a definition of an earlier configuration") {
		t.Errorf("a group on a GPU the held claim uses: %v", err)
	}
	redefined := claim("pair", "g01-2x")
	if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{redefined}).Errs[redefined.UID]; err != nil {
		t.Errorf("the redefined group, on GPUs nobody uses: %v", err)
	}
	if _, err := l.Release(r.ctx, []types.UID{held.UID}); err != nil {
		t.Fatal(err)
	}
	if u := r.lastUsage(); len(u.Fenced) != 0 {
		t.Errorf("fenced %v after the release", u.Fenced)
	}
	if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{onHeldGPU}).Errs[onHeldGPU.UID]; err != nil {
		t.Errorf("after the release: %v", err)
	}
}

// A claim allocated here with neither a status nor a spec was never given
// to a container: it is not recorded, and the kubelet prepares it again.
func TestRebuildLeavesAClaimWithNoRecordToItsNextPrepare(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	c := claim("c", "g0-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
	r.store(c)
	l = r.loseCheckpoint(l)
	if u := r.lastUsage(); len(u.Held) != 0 || len(u.Fenced) != 0 {
		t.Errorf("usage %+v after rebuilding a claim without records", u)
	}
	if got := reserve(r.ctx, l, []*resourceapi.ResourceClaim{c}); got.Errs[c.UID] != nil || !got.Fresh[c.UID] {
		t.Errorf("its next prepare: %v, fresh %v", got.Errs[c.UID], got.Fresh[c.UID])
	}
}

// A per-seat device of a fenced group is one of the seats the fencing
// claim may use: it is not handed out either.
func TestPerSeatDeviceOfAFencedGroupIsRefused(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	c := claim("c", "g4-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{c})
	r.store(c, `{"seats":"garbage"}`)
	l = r.loseCheckpoint(l)
	if u := r.lastUsage(); u.Fenced[4] != FenceSeatsUnknown {
		t.Fatalf("GPU 4 is not fenced: %+v", u)
	}
	for s := range 4 {
		n := claim(fmt.Sprintf("seat%d", s), fmt.Sprintf("g4-1x-seat-%d", s))
		n.Status.Allocation.Devices.Results[0].ShareID = nil
		res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{n})
		if err := res.Errs[n.UID]; err == nil || !strings.Contains(err.Error(), "group G4 is fenced") {
			t.Errorf("per-seat device g4-1x-seat-%d of the fenced group: %v, seats %v", s, err, seatsOf(res.Entries[n.UID]))
		}
	}
}

// A group redefined while held, then the checkpoint lost: the records
// name the GPUs the container was given, which today's group does not
// have. The fence covers them, not only today's GPUs.
func TestRebuildFencesTheGPUsTheRecordsName(t *testing.T) {
	const ones = "grouping: explicit\ngroups:\n- {name: G0, gpus: [0]}\n- {name: G1, gpus: [1]}\n- {name: G2, gpus: [2]}\n- {name: G3, gpus: [3]}\n"
	const before = fourSeats + ones + "- {name: G01, gpus: [0, 1]}\n"
	const after = fourSeats + ones + "- {name: G01, gpus: [2, 3]}\n"
	r := newRig(t, "dgx-h100", before)
	l := r.open()
	held := claim("held", "g01-2x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{held})
	if err := r.specs.Write(held.UID, res.Entries[held.UID]); err != nil {
		t.Fatal(err)
	}
	r.store(held, statusOf(res.Entries[held.UID].Devices[0]))
	l.Close(r.ctx)
	r.opts.Plan = simnodetest.New(t, "dgx-h100", after).Plan
	l = r.open()
	l = r.loseCheckpoint(l)
	if u := r.lastUsage(); !slices.Equal(slices.Sorted(maps.Keys(u.Fenced)), []int{0, 1, 2, 3}) {
		t.Errorf("fenced %v, want GPUs 0 and 1 (the container's) and 2 and 3 (today's G01)", u.Fenced)
	}
	one := claim("one", "g0-1x")
	if err := reserve(r.ctx, l, []*resourceapi.ResourceClaim{one}).Errs[one.UID]; err == nil {
		t.Errorf("g0-1x, on GPU 0 the held claim's container uses, was handed out after the rebuild")
	}
}

// A claim whose UID no spec can be written for was never prepared: the
// rebuild passes it by instead of failing on it.
func TestRebuildPassesByAClaimWithAnUnsafeUID(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	odd := claim("odd", "g0-1x")
	odd.UID = "../../etc/odd"
	r.store(odd, fmt.Sprintf(`{"profile":"1x","group":"G0","gpus":[0],"gpuUUIDs":[%q],"seats":[0],"generations":[1]}`, r.opts.Inventory.GPUs[0].UUID))
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{claim("a", "g1-1x")})
	l = r.loseCheckpoint(l)
	if got := newSeatOn(t, r, l, "g0-1x"); !slices.Equal(got, []int{0}) {
		t.Errorf("a new claim got seat %v of g0-1x, want 0: the claim with the unsafe UID holds none", got)
	}
}
