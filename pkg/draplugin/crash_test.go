package draplugin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint/checkpointtest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// crashRig plays the kubelet against a plugin running in a child process
// that it can have SIGKILLed at any step, and checks what the node's files
// say after every crash and restart.
type crashRig struct {
	t      testing.TB
	spec   childSpec
	dir    string
	plan   *planner.Plan
	claims []*resourceapi.ResourceClaim

	cmd  *exec.Cmd
	conn *grpc.ClientConn
	dra  drapb.DRAPluginClient

	// The kubelet's view: claims it got CDI IDs for, and those IDs.
	prepared map[types.UID][]string
	// Counts for the report: crashes, starts, checkpoints lost; seats that
	// two live claims' containers were given (doubled), and seats a live
	// claim's container was given that the checkpoint does not hold for
	// it (lost: the next claim could get them).
	crashes, restarts, losses int
	doubled, lost             int
	crashedAt                 map[draplugin.HookPoint]int
	// mig accounts for the MIG instances where the node has MIG seats.
	mig *migAccount
}

// crashNode is the node a crash rig plays on and the classes of the
// claims it allocates there.
type crashNode struct {
	preset, config string
	classes        []string
	// claim, where set, may narrow claim i's request before it is
	// allocated.
	claim func(i int, c *resourceapi.ResourceClaim)
	// mig, where set, gives the plugin the node's NVML to make MIG
	// instances with, and sets up the GPUs' MIG state before the first
	// start.
	mig func(t testing.TB, r *crashRig)
}

func newCrashRig(t testing.TB) *crashRig {
	t.Helper()
	return newCrashRigOn(t, crashNode{preset: "nvlink-2x4", config: seed,
		classes: []string{class2x, class2x, class1x, class1x, class1x, class1x, class1x, class1x, class2x, class1x}})
}

func newCrashRigOn(t testing.TB, node crashNode) *crashRig {
	t.Helper()
	dir, err := os.MkdirTemp("", "kyb-crash-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &crashRig{t: t, dir: dir, prepared: map[types.UID][]string{}, crashedAt: map[draplugin.HookPoint]int{}}
	r.spec = childSpec{
		Preset: node.preset, Config: node.config,
		RegDir: filepath.Join(dir, "reg"), PluginDir: filepath.Join(dir, "plugin"), CDIDir: filepath.Join(dir, "cdi"),
		BootIDFile: filepath.Join(dir, "boot_id"),
	}
	for _, d := range []string{r.spec.RegDir, r.spec.PluginDir, r.spec.CDIDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(r.spec.BootIDFile, []byte("boot-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Claims allocated together by the scheduler's allocator, so that any
	// subset of them may be prepared at the same time.
	sn := simnodetest.New(t, r.spec.Preset, node.config)
	inv := sn.Inv
	r.plan = sn.Plan
	cl := schedulertest.New(schedulertest.SchedulerFeatures())
	cl.AddNode(nodeName, draresources.Resources(r.plan, inv, nodeName, draresources.LayoutShared), driver.Name)
	cl.AddClasses(draresources.DeviceClasses(r.plan.Profiles, draresources.DeviceClassOptions{})...)
	for i, class := range node.classes {
		c := schedulertest.Claim(fmt.Sprintf("c%d", i), class, 1)
		c.UID = types.UID(fmt.Sprintf("aaaaaaaa-0000-0000-0000-%012d", i))
		if node.claim != nil {
			node.claim(i, c)
		}
		alloc, err := cl.Allocate(context.Background(), c, nodeName)
		if err != nil || alloc == nil {
			t.Fatalf("allocate claim %d: %v", i, err)
		}
		c.Status.Allocation = alloc
		r.claims = append(r.claims, c)
		r.spec.Claims = append(r.spec.Claims, *c)
	}
	if node.mig != nil {
		node.mig(t, r)
	}
	t.Cleanup(r.stop)
	return r
}

// start starts the plugin child, crashing at (point, pass) if point is set.
func (r *crashRig) start(point draplugin.HookPoint, pass int) {
	r.t.Helper()
	spec := r.spec
	spec.CrashAt, spec.CrashOnPass = point, pass
	raw, _ := json.Marshal(spec)
	file := filepath.Join(r.dir, "child.json")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		r.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KYB_CRASH_CHILD="+file)
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.cmd = cmd
	r.restarts++
	// Wait for the DRA socket to answer: the kubelet may call as soon as it
	// does, while the plugin still publishes.
	sock := filepath.Join(spec.PluginDir, "dra.sock")
	deadline := time.Now().Add(20 * time.Second)
	// Drain the child's first line, whatever it says, so that it never
	// blocks on its output.
	go func() { _, _ = bufio.NewReader(out).ReadString('\n') }()
	for {
		// A fresh connection per attempt: gRPC backs off a second after a
		// failed dial, which would dominate a restart.
		var err error
		if _, statErr := os.Stat(sock); statErr == nil {
			var conn *grpc.ClientConn
			if conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err = drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}, grpc.WaitForReady(false))
				cancel()
				if err == nil {
					r.conn, r.dra = conn, drapb.NewDRAPluginClient(conn)
					return
				}
				conn.Close()
			}
		} else {
			err = statErr
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the plugin child did not come up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *crashRig) stop() {
	if r.cmd == nil {
		return
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		r.t.Fatalf("stop the plugin: %v", err)
	}
	// The exit status of a plugin stopped by SIGTERM is not the test's
	// business; that it exits is.
	_ = r.cmd.Wait()
	r.cmd = nil
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
}

// alive reports whether the child still runs (after a failed call: did it crash?).
func (r *crashRig) crashed() bool {
	if r.cmd == nil {
		return true
	}
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
		r.cmd = nil
		if r.conn != nil {
			r.conn.Close()
			r.conn = nil
		}
		return true
	case <-time.After(3 * time.Second):
		return false
	}
}

// call drives one kubelet call; ok is false when the plugin died during it.
func (r *crashRig) call(op string, c *resourceapi.ResourceClaim) (ok bool) {
	r.t.Helper()
	ref := &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch op {
	case "prepare":
		resp, err := r.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
		if err != nil {
			if !r.crashed() {
				r.t.Fatalf("prepare %s failed without a crash: %v", c.Name, err)
			}
			return false
		}
		res := resp.Claims[string(c.UID)]
		if res.Error != "" && r.mig != nil {
			if ok, fenced := r.fenced(c, res.Error); fenced {
				return ok
			}
		}
		if res.Error != "" {
			r.t.Fatalf("prepare %s: %s", c.Name, res.Error)
		}
		var ids []string
		for _, d := range res.Devices {
			ids = append(ids, d.CdiDeviceIds...)
		}
		if prev, ok := r.prepared[c.UID]; ok && !slices.Equal(prev, ids) {
			r.t.Fatalf("prepare %s again returned %v, first %v", c.Name, ids, prev)
		}
		r.prepared[c.UID] = ids
	case "unprepare":
		resp, err := r.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}})
		if err != nil {
			if !r.crashed() {
				r.t.Fatalf("unprepare %s failed without a crash: %v", c.Name, err)
			}
			return false
		}
		if e := resp.Claims[string(c.UID)].Error; e != "" {
			r.t.Fatalf("unprepare %s: %s", c.Name, e)
		}
		delete(r.prepared, c.UID)
		// Its status goes with its allocation.
		r.setStatus(c.UID, nil)
	}
	return true
}

// drive runs a kubelet call, crashing the plugin at (point, pass) when
// point is set, then restarts it and re-drives the call as the kubelet
// would, until it succeeds.
func (r *crashRig) drive(op string, c *resourceapi.ResourceClaim, point draplugin.HookPoint, pass int) {
	r.driveThen(op, op, c, point, pass)
}

// driveThen is drive, re-driving with retry instead of op after a crash:
// a pod deleted while its prepare crashed is unprepared, not prepared again.
func (r *crashRig) driveThen(op, retry string, c *resourceapi.ResourceClaim, point draplugin.HookPoint, pass int) {
	r.t.Helper()
	if point != "" {
		r.stop()
		r.start(point, pass)
	} else if r.cmd == nil {
		r.start("", 0)
	}
	if r.call(op, c) {
		if point != "" {
			// The crash point was not reached by this call: run on without it.
			r.stop()
			r.start("", 0)
		}
		return
	}
	r.crashes++
	r.crashedAt[point]++
	r.start("", 0)
	if !r.call(retry, c) {
		r.t.Fatalf("%s %s failed after the restart", retry, c.Name)
	}
	r.check()
}

// setStatus sets the status data of a claim in the API server the next
// plugin child starts with (nil: none).
func (r *crashRig) setStatus(uid types.UID, entry *checkpoint.Claim) {
	for i := range r.spec.Claims {
		c := &r.spec.Claims[i]
		if c.UID != uid {
			continue
		}
		c.Status.Devices = nil
		if entry == nil {
			return
		}
		for _, d := range entry.Devices {
			data, err := json.Marshal(d.SeatStatus)
			if err != nil {
				r.t.Fatal(err)
			}
			share := d.ShareID
			c.Status.Devices = append(c.Status.Devices, resourceapi.AllocatedDeviceStatus{
				Driver: driver.Name, Pool: d.Pool, Device: d.Device, ShareID: &share, Data: &runtime.RawExtension{Raw: data},
			})
		}
	}
}

// loseCheckpoint plays the loss of both copies of the checkpoint while
// the plugin is down, after it wrote the statuses of some claims and not
// yet those of others: the next start rebuilds from the statuses and the
// specs on disk.
func (r *crashRig) loseCheckpoint(rng *rand.Rand) {
	r.t.Helper()
	r.stop()
	store := checkpoint.NewStore(r.spec.PluginDir)
	if _, err := os.Stat(store.Path() + ".prev"); err != nil {
		return // nothing saved twice yet: nothing to lose
	}
	st, _, err := store.Load()
	if err != nil {
		r.t.Fatal(err)
	}
	for uid, c := range st.Claims {
		if rng.Intn(2) == 0 {
			r.setStatus(uid, c)
		} else {
			r.setStatus(uid, nil)
		}
	}
	checkpointtest.Truncate(r.t, r.spec.PluginDir)
	r.losses++
}

// specSeats are the seats a claim's containers were given, read from its
// spec: "<group>/<seat>".
func (r *crashRig) specSeats(uid types.UID) []string {
	r.t.Helper()
	raw, err := os.ReadFile(filepath.Join(r.spec.CDIDir, cdi.SpecName(uid)+".json"))
	if err != nil {
		r.t.Fatalf("claim %s has no CDI spec: %v", uid, err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, d := range spec.Devices {
		env := map[string]string{}
		for _, kv := range d.ContainerEdits.Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		groups, seats := strings.Split(env["KYB_GPU_GROUP"], ","), strings.Split(env["KYB_GPU_SEAT"], ",")
		for i := range groups {
			if s := groups[i] + "/" + seats[i]; !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// countSeats counts, from what the containers of the claims the kubelet
// holds prepared were given, the seats given to two claims and the seats
// the checkpoint does not hold for their claim.
func (r *crashRig) countSeats(st *checkpoint.State) {
	given := map[string]types.UID{}
	for uid := range r.prepared {
		entry := st.Claims[uid]
		for _, s := range r.specSeats(uid) {
			if other, twice := given[s]; twice && other != uid {
				r.doubled++
				r.t.Errorf("seat %s was given to claims %s and %s", s, other, uid)
			}
			given[s] = uid
			group, seat, _ := strings.Cut(s, "/")
			n, _ := strconv.Atoi(seat)
			if entry == nil || !slices.ContainsFunc(entry.Devices, func(d checkpoint.Device) bool {
				return d.Group == group && (d.Fenced || slices.Contains(d.Seats, n))
			}) {
				r.lost++
				r.t.Errorf("seat %s of claim %s is not held for it in the checkpoint", s, uid)
			}
		}
	}
}

// check compares the node's files with the kubelet's view: the checkpoint
// is sound and holds exactly the claims the kubelet holds prepared, every
// one has its spec, no spec is orphaned, no seat is held twice, no two
// groups that exclude each other are both in use.
func (r *crashRig) check() {
	r.t.Helper()
	st, res, err := checkpoint.NewStore(r.spec.PluginDir).Load()
	if err != nil || res.RecoveredFrom != nil {
		r.t.Fatalf("checkpoint after a crash: %v %+v", err, res)
	}
	var inCheckpoint, inKubelet []string
	for uid, c := range st.Claims {
		if c.Phase != checkpoint.PrepareCompleted {
			continue
		}
		inCheckpoint = append(inCheckpoint, string(uid))
	}
	for uid := range r.prepared {
		inKubelet = append(inKubelet, string(uid))
	}
	slices.Sort(inCheckpoint)
	slices.Sort(inKubelet)
	for _, uid := range inKubelet {
		if !slices.Contains(inCheckpoint, uid) {
			r.t.Fatalf("claim %s is prepared for the kubelet but not completed in the checkpoint (%v)", uid, inCheckpoint)
		}
		if _, err := os.Stat(filepath.Join(r.spec.CDIDir, cdi.SpecName(types.UID(uid))+".json")); err != nil {
			r.t.Fatalf("claim %s has no CDI spec: %v", uid, err)
		}
	}
	specs, _ := os.ReadDir(r.spec.CDIDir)
	for _, e := range specs {
		uid := strings.TrimSuffix(strings.TrimPrefix(e.Name(), cdi.SpecName("")), ".json")
		if _, ok := st.Claims[types.UID(uid)]; !ok && strings.HasSuffix(e.Name(), ".json") {
			r.t.Fatalf("CDI spec %s belongs to no checkpointed claim", e.Name())
		}
	}
	r.countSeats(st)
	seats := map[string]types.UID{}
	var held []*planner.Group
	var migHeld []string
	for uid, c := range st.Claims {
		for _, d := range c.Devices {
			for _, s := range d.Seats {
				key := d.GroupDevice + "/" + strconv.Itoa(s)
				if other, dup := seats[key]; dup && other != uid {
					r.t.Fatalf("seat %s is held by %s and %s", key, other, uid)
				}
				seats[key] = uid
			}
			if g := r.plan.GroupByDevice(d.GroupDevice); g != nil {
				held = append(held, g)
			} else if r.mig != nil {
				migHeld = append(migHeld, d.Device)
			} else {
				r.t.Fatalf("claim %s holds %s, which is no group of the plan", uid, d.GroupDevice)
			}
		}
	}
	for _, a := range held {
		for _, b := range held {
			if a.Excludes(b) {
				r.t.Fatalf("groups %s and %s exclude each other but are both in use", a.DeviceName(), b.DeviceName())
			}
		}
	}
	if r.mig != nil {
		r.checkMIG(held, migHeld)
	}
}

// prepareCrashPoints are the steps of a prepare before its answer. The
// status write follows the answer, in the background: a crash there is
// TestStatusWrittenAfterARestart's.
var prepareCrashPoints = []draplugin.HookPoint{draplugin.HookBeforeSave, draplugin.HookAfterSave, draplugin.HookAfterCDIWrite}

var unprepareCrashPoints = []draplugin.HookPoint{draplugin.HookAfterCDIRemove, draplugin.HookAfterUnprepareSave}

// TestCrashAtEveryStep kills the plugin process at every step of prepare
// and unprepare, restarts it and re-drives the kubelet's call.
func TestCrashAtEveryStep(t *testing.T) {
	r := newCrashRig(t)
	for i, point := range prepareCrashPoints {
		c := r.claims[i]
		r.drive("prepare", c, point, 1)
		r.drive("prepare", c, "", 0) // idempotent after the crash
		r.check()
	}
	for i, point := range unprepareCrashPoints {
		r.drive("unprepare", r.claims[i], point, 1)
		r.check()
	}
	// A prepare that crashed half-way, then abandoned: the kubelet
	// unprepares, and nothing of the claim is left.
	for _, point := range prepareCrashPoints {
		c := r.claims[len(r.claims)-1]
		r.driveThen("prepare", "unprepare", c, point, 1)
		st, _, _ := checkpoint.NewStore(r.spec.PluginDir).Load()
		if _, left := st.Claims[c.UID]; left {
			t.Errorf("abandoned prepare (crash %s) left the claim in the checkpoint", point)
		}
	}
	// The released seats go to new claims with new generations.
	r.drive("prepare", r.claims[0], "", 0)
	r.check()
	if want := 2*len(prepareCrashPoints) + len(unprepareCrashPoints); r.crashes != want {
		t.Errorf("%d crashes, want one per step and case (%d): %v", r.crashes, want, r.crashedAt)
	}
	t.Logf("crash points covered: %d, crashes %d, plugin starts %d", len(r.crashedAt), r.crashes, r.restarts)
}

// TestRandomCrashes drives random prepares and unprepares of random claims
// with crashes at random steps, and now and then loses both copies of the
// checkpoint with the statuses of only some claims written.
// KYB_CRASH_ITERATIONS sets the count (make soak runs 1,000), and the run
// ends with the seats doubled and lost, counted from what the containers
// of the live claims were given: both must be 0.
func TestRandomCrashes(t *testing.T) {
	iterations := 40
	if s := os.Getenv("KYB_CRASH_ITERATIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("KYB_CRASH_ITERATIONS=%q: %v", s, err)
		}
		iterations = n
	}
	seed := time.Now().UnixNano()
	if s := os.Getenv("KYB_CRASH_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (set KYB_CRASH_SEED to repeat)", seed)
	r := newCrashRig(t)
	r.soak(rand.New(rand.NewSource(seed)), iterations, prepareCrashPoints, unprepareCrashPoints)
	t.Logf("seats doubled: %d, seats lost: %d", r.doubled, r.lost)
}

// soak drives iterations random prepares and unprepares of random claims,
// crashing at random points among those given.
func (r *crashRig) soak(rng *rand.Rand, iterations int, prepareCrashPoints, unprepareCrashPoints []draplugin.HookPoint) {
	r.t.Helper()
	for i := 0; i < iterations; i++ {
		c := r.claims[rng.Intn(len(r.claims))]
		op, points := "prepare", prepareCrashPoints
		if _, prepared := r.prepared[c.UID]; prepared && rng.Intn(3) > 0 {
			op, points = "unprepare", unprepareCrashPoints
		}
		var point draplugin.HookPoint
		if rng.Intn(2) == 0 {
			point = points[rng.Intn(len(points))]
		}
		retry := op
		if op == "prepare" && rng.Intn(3) == 0 {
			retry = "unprepare" // the pod went away while its prepare crashed
		}
		if rng.Intn(8) == 0 {
			r.loseCheckpoint(rng)
		}
		r.driveThen(op, retry, c, point, 1)
		r.check()
	}
	r.t.Logf("iterations %d, crashes %d at %d distinct points %v, checkpoints lost %d, plugin starts %d", iterations, r.crashes, len(r.crashedAt), r.crashedAt, r.losses, r.restarts)
}
