package seatledger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint/checkpointtest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// The ledger on its own: a simulated node's plan, its checkpoint in a
// temporary directory, specs kept in memory, and a fake API server.

const pool = "node-1"

// memSpecs keeps specs in memory and can be made to fail.
type memSpecs struct {
	mu         sync.Mutex
	specs      map[types.UID]*checkpoint.Claim
	failRemove bool
	// stuck are the specs that cannot be removed.
	stuck map[types.UID]bool
}

func newMemSpecs() *memSpecs { return &memSpecs{specs: map[types.UID]*checkpoint.Claim{}} }

func (m *memSpecs) Exists(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.specs[uid]
	return ok
}

func (m *memSpecs) Write(uid types.UID, c *checkpoint.Claim) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.specs[uid] = c
	return nil
}

func (m *memSpecs) Complete(uid types.UID, _ *checkpoint.Claim) bool { return m.Exists(uid) }

func (m *memSpecs) Remove(uid types.UID, _ types.NamespacedName) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failRemove || m.stuck[uid] {
		return errors.New("read-only file system")
	}
	delete(m.specs, uid)
	return nil
}

// ReadEnv gives back what a spec written from the entry holds: per CDI
// device, the KYB_* variables of its request (every seat of the request,
// device by device) and the request's GPU UUIDs.
func (m *memSpecs) ReadEnv(uid types.UID) (map[string]map[string]string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.specs[uid]
	if !ok {
		return nil, false, nil
	}
	type lists struct{ groups, seats, gens, uuids []string }
	byRequest := map[string]*lists{}
	for _, d := range c.Devices {
		l := byRequest[d.Requests[0]]
		if l == nil {
			l = &lists{}
			byRequest[d.Requests[0]] = l
		}
		for i, s := range d.Seats {
			l.groups = append(l.groups, d.Group)
			l.seats = append(l.seats, fmt.Sprint(s))
			l.gens = append(l.gens, fmt.Sprint(d.Generations[i]))
		}
		l.uuids = append(l.uuids, d.GPUUUIDs...)
	}
	env := map[string]map[string]string{}
	for _, d := range c.Devices {
		l := byRequest[d.Requests[0]]
		env[d.CDIDevice] = map[string]string{
			"KYB_GPU_GROUP": strings.Join(l.groups, ","), "KYB_GPU_SEAT": strings.Join(l.seats, ","),
			"KYB_SEAT_GEN": strings.Join(l.gens, ","), "NVIDIA_VISIBLE_DEVICES": strings.Join(l.uuids, ","),
		}
	}
	return env, true, nil
}

func (m *memSpecs) Claims() ([]types.UID, []string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []types.UID
	for uid := range m.specs {
		out = append(out, uid)
	}
	slices.Sort(out)
	return out, nil, nil
}

type rig struct {
	t      *testing.T
	ctx    context.Context
	logger klog.Logger
	dir    string
	opts   Options
	specs  *memSpecs
	client *fake.Clientset
	usage  []Usage
	heldMu sync.Mutex
}

// newRig prepares a ledger's options on node-1 of preset with config.
func newRig(t *testing.T, preset, config string) *rig {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	node := simnodetest.New(t, preset, config)
	r := &rig{t: t, ctx: ctx, logger: logger, dir: t.TempDir(), specs: newMemSpecs(), client: fake.NewClientset()}
	r.opts = Options{
		Pool: pool, Plan: node.Plan, Inventory: node.Inv, Dir: r.dir,
		Specs: r.specs, Claims: r.client.ResourceV1(), Clock: testingclock.NewFakeClock(time.Unix(1_800_000_000, 0)),
		UsageChanged: func(u Usage) {
			r.heldMu.Lock()
			r.usage = append(r.usage, u)
			r.heldMu.Unlock()
		},
	}
	r.setBootID("boot-1")
	return r
}

func (r *rig) setBootID(id string) { r.opts.BootID = id }

func (r *rig) open() *Ledger {
	r.t.Helper()
	l, err := Open(r.ctx, r.opts)
	if err != nil {
		r.t.Fatalf("Open: %v", err)
	}
	r.t.Cleanup(func() { l.Close(r.ctx) })
	return l
}

func (r *rig) lastHeld() draresources.Held { return r.lastUsage().Held }

func (r *rig) lastUsage() Usage {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	if len(r.usage) == 0 {
		return Usage{}
	}
	return r.usage[len(r.usage)-1]
}

// reserve reserves seats as a prepare does, and lets the claims' locks go
// at once: the tests write no specs.
func reserve(ctx context.Context, l *Ledger, claims []*resourceapi.ResourceClaim) reserved {
	r := l.Reserve(ctx, claims)
	r.Done()
	return byClaim(r)
}

// reserved is a reservation's answers by claim, as the tests read them.
type reserved struct {
	*Reservation
	Entries        map[types.UID]*checkpoint.Claim
	Fresh, Rewrite map[types.UID]bool
	Errs           map[types.UID]error
	Widened        []types.UID
	// Lost: every claim was refused for the lost checkpoint.
	Lost bool
}

func byClaim(r *Reservation) reserved {
	out := reserved{Reservation: r, Entries: map[types.UID]*checkpoint.Claim{}, Fresh: map[types.UID]bool{}, Rewrite: map[types.UID]bool{}, Errs: map[types.UID]error{}, Widened: r.widened}
	out.Lost = len(r.Claims) > 0
	for _, o := range r.Claims {
		uid := o.Claim.UID
		switch o.State {
		case Refused:
			out.Errs[uid] = o.Err
		case Fresh:
			out.Fresh[uid] = true
		case SpecOwed:
			out.Rewrite[uid] = true
		}
		if o.Entry != nil {
			out.Entries[uid] = o.Entry
		}
		out.Lost = out.Lost && errors.Is(o.Err, ErrCheckpointLost)
	}
	return out
}

// claim is a claim allocated on devices of this driver, one result per
// device (a share of a shared device: a share ID each).
func claim(name string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
	alloc := &resourceapi.AllocationResult{}
	for i, d := range devices {
		share := types.UID(fmt.Sprintf("share-%s-%d", name, i))
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu", Driver: driver.Name, Pool: pool, Device: d, ShareID: &share,
		})
	}
	c.Status.Allocation = alloc
	return c
}

func seatsOf(c *checkpoint.Claim) [][]int {
	var out [][]int
	for _, d := range c.Devices {
		out = append(out, d.Seats)
	}
	return out
}

const fourSeats = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 2}
`

func TestReserveChoosesTheLowestFreeSeatsAndRecordsThem(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a, b := claim("a", "g0-1x"), claim("b", "g0-1x", "g0-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a, b})
	if res.Err != nil || len(res.Errs) != 0 {
		t.Fatalf("Reserve: %v %v", res.Err, res.Errs)
	}
	if got := seatsOf(res.Entries[a.UID]); !slices.EqualFunc(got, [][]int{{0}}, slices.Equal) {
		t.Errorf("a holds seats %v, want [[0]]", got)
	}
	if got := seatsOf(res.Entries[b.UID]); !slices.EqualFunc(got, [][]int{{1}, {2}}, slices.Equal) {
		t.Errorf("b holds seats %v, want [[1] [2]]", got)
	}
	if !res.Fresh[a.UID] || !res.Fresh[b.UID] {
		t.Errorf("fresh %v, want both", res.Fresh)
	}
	dev := res.Entries[a.UID].Devices[0]
	if dev.GroupDevice != "g0-1x" || dev.Group != "G0" || dev.Profile != "1x" || !slices.Equal(dev.Generations, []int64{1}) || dev.CDIDevice != "g0-1x-share-a-0" {
		t.Errorf("a's device %+v", dev)
	}
	if got := r.lastHeld(); got["g0-1x"] != 3 || len(got) != 1 {
		t.Errorf("held %v, want g0-1x: 3", got)
	}
	// A repeated prepare gets the recorded entry: nothing handed out twice.
	again := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a})
	if again.Fresh[a.UID] || again.Entries[a.UID] != res.Entries[a.UID] {
		t.Errorf("repeated prepare: fresh %v, entry %+v", again.Fresh, again.Entries[a.UID])
	}
	// The record is on disk.
	st, _, err := checkpoint.NewStore(r.dir).Load()
	if err != nil || len(st.Claims) != 2 || st.BootID != "boot-1" {
		t.Fatalf("checkpoint on disk: %v claims, boot %q, %v", len(st.Claims), st.BootID, err)
	}
}

func TestReserveRefusesWhatCannotBeHeldForThatClaimOnly(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	held := claim("held", "g01-2x")
	other := claim("other-pool", "g2-1x")
	other.Status.Allocation.Devices.Results[0].Pool = "node-2"
	unknown := claim("unknown", "g99-1x")
	overlap := claim("overlap", "g0-1x")
	badConfig := claim("bad-config", "g3-1x")
	badConfig.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver.Name, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig","visibleDevices":"serial"}`)},
		}},
	}}
	good := claim("good", "g4-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{held, other, unknown, overlap, badConfig, good})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	want := map[types.UID]string{
		other.UID:     `prepare claim default/other-pool (uid-other-pool): device g2-1x is in pool "node-2", but this node's pool is "node-1"`,
		unknown.UID:   "prepare claim default/unknown (uid-unknown): device g99-1x is not published by this node",
		overlap.UID:   "prepare claim default/overlap (uid-overlap): GPU(s) 0 of group G0 (1x) are in use by claim default/held (uid-held) through group G01 (2x)",
		badConfig.UID: `visibleDevices: must be "uuid" or "index", not "serial"`,
	}
	for uid, msg := range want {
		if err := res.Errs[uid]; err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want %q", uid, err, msg)
		}
		if res.Entries[uid] != nil {
			t.Errorf("%s was recorded although refused", uid)
		}
	}
	for _, ok := range []types.UID{held.UID, good.UID} {
		if res.Errs[ok] != nil || !res.Fresh[ok] {
			t.Errorf("%s: %v, fresh %v", ok, res.Errs[ok], res.Fresh[ok])
		}
	}
}

// A claim whose UID cannot name a spec file is refused before it holds
// anything: its seats would never be released.
func TestUnsafeClaimUIDIsRefusedBeforeAnySeatIsRecorded(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	bad := claim("bad", "g0-1x")
	bad.UID = "../../etc/passwd"
	good := claim("good", "g0-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{bad, good})
	if err := res.Errs[bad.UID]; err == nil || !strings.Contains(err.Error(), `claim UID "../../etc/passwd" is not a safe file name`) {
		t.Errorf("unsafe UID: %v", err)
	}
	if got := seatsOf(res.Entries[good.UID]); !slices.EqualFunc(got, [][]int{{0}}, slices.Equal) {
		t.Errorf("the good claim holds %v, want seat 0: the refused one must hold none", got)
	}
	if got := r.lastHeld(); got["g0-1x"] != 1 {
		t.Errorf("held %v, want one seat of g0-1x", got)
	}
}

func TestReleaseFreesSeatsAndTheNextHolderGetsANewGeneration(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a := claim("a", "g0-1x")
	if res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a}); res.Err != nil || res.Errs[a.UID] != nil {
		t.Fatal(res.Err, res.Errs)
	}
	if err := r.specs.Write(a.UID, &checkpoint.Claim{}); err != nil {
		t.Fatal(err)
	}
	released, err := l.Release(r.ctx, []types.UID{a.UID, "uid-never-prepared"})
	if err != nil || released[a.UID] != nil || released["uid-never-prepared"] != nil {
		t.Fatalf("Release: %v %v", released, err)
	}
	if r.specs.Exists(a.UID) {
		t.Error("the released claim's spec is still there")
	}
	if got := r.lastHeld(); len(got) != 0 {
		t.Errorf("held after the release: %v", got)
	}
	b := claim("b", "g0-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{b})
	dev := res.Entries[b.UID].Devices[0]
	if !slices.Equal(dev.Seats, []int{0}) || !slices.Equal(dev.Generations, []int64{2}) {
		t.Errorf("the next holder of seat 0 got seats %v generations %v, want [0] [2]", dev.Seats, dev.Generations)
	}
}

func TestReleaseKeepsTheSeatsOfAClaimWhoseSpecCannotGo(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a := claim("a", "g0-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{a})
	r.specs.failRemove = true
	released, err := l.Release(r.ctx, []types.UID{a.UID})
	if err != nil || released[a.UID] == nil {
		t.Fatalf("Release: %v %v, want an error for the claim", released, err)
	}
	if got := r.lastHeld(); got["g0-1x"] != 1 {
		t.Errorf("held %v: a claim whose spec stays must keep its seat", got)
	}
}

// Prepares that arrive together share saves, and still get distinct seats.
func TestConcurrentReservesGetDistinctSeats(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	// Saves run under the ledger's lock, one at a time.
	n := 0
	r.opts.Hooks.AfterSave = func() { n++ }
	l := r.open()
	var claims []*resourceapi.ResourceClaim
	for i := range 16 {
		claims = append(claims, claim(fmt.Sprintf("c%d", i), fmt.Sprintf("g%d-1x", i%4)))
	}
	results := make([]reserved, len(claims))
	var wg sync.WaitGroup
	for i, c := range claims {
		wg.Go(func() { results[i] = reserve(r.ctx, l, []*resourceapi.ResourceClaim{c}) })
	}
	wg.Wait()
	seen := map[string]types.UID{}
	for i, res := range results {
		c := claims[i]
		if res.Err != nil || res.Errs[c.UID] != nil {
			t.Fatalf("%s: %v %v", c.Name, res.Err, res.Errs)
		}
		dev := res.Entries[c.UID].Devices[0]
		k := checkpoint.SeatKey(dev.GroupDevice, dev.Seats[0])
		if other, dup := seen[k]; dup {
			t.Errorf("seat %s handed to %s and %s", k, other, c.UID)
		}
		seen[k] = c.UID
	}
	if len(seen) != 16 {
		t.Errorf("%d seats held, want 16", len(seen))
	}
	if n > 16 {
		t.Errorf("%d saves for 16 claims", n)
	}
}

func TestOpenRepairsTheSpecsAfterAReboot(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a := claim("a", "g0-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{a})
	l.Close(r.ctx)
	// A reboot empties the CDI directory (a tmpfs); a stray spec that no
	// claim owns is there too.
	r.specs.specs = map[types.UID]*checkpoint.Claim{"uid-stray": {}}
	r.setBootID("boot-2")
	l = r.open()
	if !r.specs.Exists(a.UID) || r.specs.Exists("uid-stray") {
		t.Errorf("specs after the repair: %v", r.specs.specs)
	}
	st, _, err := checkpoint.NewStore(r.dir).Load()
	if err != nil || st.BootID != "boot-2" || st.GenerationFloor < 1_800_000_000 {
		t.Errorf("after a reboot: boot %q, generation floor %d (%v); the floor must rise above the clock", st.BootID, st.GenerationFloor, err)
	}
	b := claim("b", "g0-1x")
	if gen := reserve(r.ctx, l, []*resourceapi.ResourceClaim{b}).Entries[b.UID].Devices[0].Generations[0]; gen <= 1_800_000_000 {
		t.Errorf("a seat handed out after a reboot has generation %d, want above the clock", gen)
	}
}

// A spec the ledger cannot remove (a read-only CDI directory) does not
// stop it from starting: it is logged and left.
func TestOpenLeavesASpecItCannotRemove(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	r.specs.specs["uid-orphan"] = &checkpoint.Claim{}
	r.specs.failRemove = true
	l := r.open()
	if !r.specs.Exists("uid-orphan") {
		t.Error("the spec that cannot be removed is gone")
	}
	a := claim("a", "g0-1x")
	if res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a}); res.Err != nil || res.Errs[a.UID] != nil {
		t.Errorf("the ledger does not serve after leaving a spec: %v %v", res.Err, res.Errs)
	}
}

// storeWithStatus stores c in the fake API server with the seats its
// entry recorded in its status, as the plugin's status writer does.
func (r *rig) storeWithStatus(c *resourceapi.ResourceClaim, entry *checkpoint.Claim) {
	r.t.Helper()
	for _, dev := range entry.Devices {
		data := fmt.Sprintf(`{"profile":%q,"group":%q,"gpus":[%d],"gpuUUIDs":[%q],"seats":[%d],"generations":[%d]}`,
			dev.Profile, dev.Group, dev.GPUs[0], dev.GPUUUIDs[0], dev.Seats[0], dev.Generations[0])
		share := dev.ShareID
		c.Status.Devices = append(c.Status.Devices, resourceapi.AllocatedDeviceStatus{
			Driver: driver.Name, Pool: dev.Pool, Device: dev.Device, ShareID: &share, Data: &runtime.RawExtension{Raw: []byte(data)},
		})
	}
	if _, err := r.client.ResourceV1().ResourceClaims(c.Namespace).Create(r.ctx, c, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

func TestLostCheckpointIsRebuiltFromTheClaimsStatus(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a, b := claim("a", "g0-1x"), claim("b", "g0-1x")
	res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a, b})
	r.storeWithStatus(a, res.Entries[a.UID])
	// b's status was never written: the kubelet prepares it again.
	if _, err := r.client.ResourceV1().ResourceClaims("default").Create(r.ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.Close(r.ctx)
	checkpointtest.Truncate(t, r.dir)
	l = r.open()
	if l.Lost() {
		t.Fatal("the ledger is lost although the API server answers")
	}
	got := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a})
	if got.Fresh[a.UID] || !slices.Equal(got.Entries[a.UID].Devices[0].Seats, []int{0}) {
		t.Errorf("a after the rebuild: fresh %v seats %v, want its recorded seat 0", got.Fresh[a.UID], got.Entries[a.UID].Devices[0].Seats)
	}
	kept, _ := filepath.Glob(filepath.Join(r.dir, checkpoint.FileName+"*.corrupt-*"))
	if len(kept) != 2 {
		t.Errorf("the unusable files must be kept aside for diagnosis: %v", kept)
	}
}

func TestLostCheckpointWhileTheAPIServerIsDown(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a := claim("a", "g0-1x")
	reserve(r.ctx, l, []*resourceapi.ResourceClaim{a})
	l.Close(r.ctx)
	checkpointtest.Truncate(t, r.dir)
	var down sync.Mutex
	isDown := true
	r.client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		down.Lock()
		defer down.Unlock()
		if isDown {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	r.opts.Clock = testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	l = r.open()
	if !l.Lost() {
		t.Fatal("the ledger is not lost although neither the checkpoint nor the API server can be read")
	}
	b := claim("b", "g1-1x")
	if res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{b}); !res.Lost || res.Errs[b.UID] == nil || !strings.Contains(res.Errs[b.UID].Error(), "checkpoint was lost and is not rebuilt yet") {
		t.Errorf("a new claim while lost: %v", res.Errs[b.UID])
	}
	if released, err := l.Release(r.ctx, []types.UID{a.UID}); err != nil || released[a.UID] != nil {
		t.Errorf("a release while lost: %v %v", released, err)
	}
	down.Lock()
	isDown = false
	down.Unlock()
	// The retry's backoff runs on the real clock: a second.
	deadline := time.Now().Add(10 * time.Second)
	for l.Lost() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if l.Lost() {
		t.Fatal("the ledger was not rebuilt once the API server answered")
	}
	if res := reserve(r.ctx, l, []*resourceapi.ResourceClaim{b}); res.Errs[b.UID] != nil || !res.Fresh[b.UID] {
		t.Errorf("a new claim after the rebuild: %v", res.Errs[b.UID])
	}
}

func TestSeatStatusIsWhatTheDeviceRecords(t *testing.T) {
	r := newRig(t, "dgx-h100", fourSeats)
	l := r.open()
	a := claim("a", "g01-2x")
	dev := reserve(r.ctx, l, []*resourceapi.ResourceClaim{a}).Entries[a.UID].Devices[0]
	want := v1alpha1.SeatStatus{Profile: "2x", Group: "G01", GPUs: []int{0, 1}, GPUUUIDs: []string{r.opts.Inventory.GPUs[0].UUID, r.opts.Inventory.GPUs[1].UUID}, Seats: []int{0}, Generations: []int64{1}}
	if fmt.Sprint(dev.SeatStatus) != fmt.Sprint(want) {
		t.Errorf("seat status %+v, want %+v", dev.SeatStatus, want)
	}
}
