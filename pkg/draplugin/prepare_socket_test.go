package draplugin_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

const seed = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
groups: [{name: G01, gpus: [0, 1]}, {name: G23, gpus: [2, 3]}]
`

const (
	class1x = "gpu-1x-seat.kyb.ai"
	class2x = "gpu-2x-seat.kyb.ai"
)

func TestPrepareWritesSpecEnvAndStatusOverSockets(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	claim := e.claim(class2x)
	share := string(*claim.Status.Allocation.Devices.Results[0].ShareID)
	ids := e.prepareOK(claim)
	want := "kyb.ai/gpu=" + string(claim.UID) + "-g01-2x-" + share
	if len(ids) != 1 || ids[0] != want {
		t.Fatalf("CDI IDs %v, want [%s]", ids, want)
	}

	env, devs := e.container(ids...)
	wantEnv := map[string]string{
		"CUDA_VISIBLE_DEVICES":   e.uuids(0, 1),
		"NVIDIA_VISIBLE_DEVICES": e.uuids(0, 1),
		"KYB_GPU_GROUP":          "G01",
		"KYB_GPU_SEAT":           "0",
		"KYB_SEAT_GEN":           "1",
	}
	for k, v := range wantEnv {
		if env[k] != v {
			t.Errorf("env %s=%q, want %q", k, env[k], v)
		}
	}
	wantDevs := map[string][2]int64{
		"/dev/nvidia0": {195, 0}, "/dev/nvidia1": {195, 1}, "/dev/nvidiactl": {195, 255},
		"/dev/nvidia-uvm": {511, 0}, "/dev/nvidia-uvm-tools": {511, 1},
	}
	if len(devs) != len(wantDevs) {
		t.Errorf("device nodes %v, want %v", devs, wantDevs)
	}
	for p, mm := range wantDevs {
		d, ok := devs[p]
		if !ok || d.Type != "c" || d.Major != mm[0] || d.Minor != mm[1] {
			t.Errorf("device node %s = %+v, want c %d:%d", p, d, mm[0], mm[1])
		}
	}

	// The seat is recorded in the claim's status for operators, behind
	// the call.
	stored := e.waitStatus(claim)
	if len(stored.Status.Devices) != 1 || stored.Status.Devices[0].Device != "g01-2x" || *stored.Status.Devices[0].ShareID != share {
		t.Fatalf("status.devices %+v", stored.Status.Devices)
	}
	var seat v1alpha1.SeatStatus
	if err := json.Unmarshal(stored.Status.Devices[0].Data.Raw, &seat); err != nil {
		t.Fatal(err)
	}
	if seat.Group != "G01" || seat.Profile != "2x" || len(seat.Seats) != 1 || seat.Seats[0] != 0 || seat.Generations[0] != 1 || strings.Join(seat.GPUUUIDs, ",") != e.uuids(0, 1) {
		t.Errorf("seat status %+v", seat)
	}
	for path, most := range map[string]os.FileMode{
		filepath.Join(e.dirs.cdi, cdi.SpecName(claim.UID)+".json"): 0o644,
		filepath.Join(e.dirs.plugin, checkpoint.FileName):          0o600,
		filepath.Join(e.dirs.plugin, "dra.sock"):                   0o755,
		e.dirs.plugin:                                              0o750,
	} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm()&^most != 0 {
			t.Errorf("%s: mode %v (%v), want at most %v", path, fi.Mode().Perm(), err, most)
		}
	}
}

func TestPrepareIsIdempotentAndGenerationsAdvance(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	a := e.claim(class2x)
	b := e.claim(class2x)
	idsA := e.prepareOK(a)
	again := e.prepareOK(a)
	if strings.Join(idsA, " ") != strings.Join(again, " ") {
		t.Errorf("repeated prepare returned %v, then %v", idsA, again)
	}
	envA, _ := e.container(idsA...)
	envB, _ := e.container(e.prepareOK(b)...)
	if envA["KYB_GPU_SEAT"] != "0" || envA["KYB_SEAT_GEN"] != "1" || envB["KYB_GPU_SEAT"] != "1" || envB["KYB_SEAT_GEN"] != "1" {
		t.Errorf("seats: A %s gen %s, B %s gen %s; want 0/1 and 1/1", envA["KYB_GPU_SEAT"], envA["KYB_SEAT_GEN"], envB["KYB_GPU_SEAT"], envB["KYB_SEAT_GEN"])
	}
	if r := e.unprepare(a)[string(a.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(e.dirs.cdi, cdi.SpecName(a.UID)+".json")); !os.IsNotExist(err) {
		t.Errorf("spec of an unprepared claim is still there: %v", err)
	}
	c := e.claim(class2x)
	envC, _ := e.container(e.prepareOK(c)...)
	if envC["KYB_GPU_SEAT"] != "0" || envC["KYB_SEAT_GEN"] != "2" {
		t.Errorf("seat 0 handed out again: seat %s gen %s, want 0 gen 2", envC["KYB_GPU_SEAT"], envC["KYB_SEAT_GEN"])
	}
	if r := e.unprepare(a)[string(a.UID)]; r == nil || r.Error != "" {
		t.Errorf("unprepare of an unknown claim must succeed: %+v", r)
	}
}

func TestRestartBetweenPrepareAndUnprepare(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	a := e.claim(class2x)
	idsA := e.prepareOK(a)
	e.restart()
	// Same seats, same IDs after the restart; the next claim gets the next seat.
	if again := e.prepareOK(a); strings.Join(again, " ") != strings.Join(idsA, " ") {
		t.Errorf("after restart: %v, want %v", again, idsA)
	}
	b := e.claim(class2x)
	envB, _ := e.container(e.prepareOK(b)...)
	if envB["KYB_GPU_SEAT"] != "1" {
		t.Errorf("after restart a second claim got seat %s; seat 0 is still held", envB["KYB_GPU_SEAT"])
	}
	e.restart()
	if r := e.unprepare(a, b); r[string(a.UID)].Error != "" || r[string(b.UID)].Error != "" {
		t.Fatalf("unprepare after restart: %+v", r)
	}
	st, _, err := checkpoint.NewStore(e.dirs.plugin).Load()
	if err != nil || len(st.Claims) != 0 {
		t.Errorf("checkpoint after unprepare: %+v, %v", st, err)
	}
}

func TestRebootRestoresSpecsAndRemovesOrphans(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	a := e.claim(class2x)
	idsA := e.prepareOK(a)
	e.stop()
	// Reboot: the tmpfs CDI directory is empty, the boot ID changes, and a
	// stray spec of ours (from a claim nobody recorded) is left behind.
	if err := os.RemoveAll(e.dirs.cdi); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(e.dirs.cdi, 0o755); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(e.dirs.cdi, cdi.SpecName("stray-uid")+".json")
	if err := os.WriteFile(stray, []byte(`{"cdiVersion":"0.3.0","kind":"kyb.ai/gpu","devices":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(e.dirs.cdi, "vendor.com-thing.json")
	if err := os.WriteFile(foreign, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	e.setBootID("boot-2")
	e.start()

	env, _ := e.container(idsA...)
	if env["KYB_GPU_GROUP"] != "G01" {
		t.Errorf("spec not restored after reboot: env %v", env)
	}
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Error("a spec no claim owns survived the start")
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Error("another vendor's spec was removed")
	}
	st, _, _ := checkpoint.NewStore(e.dirs.plugin).Load()
	if st.BootID != "boot-2" {
		t.Errorf("boot ID %q not recorded", st.BootID)
	}
	// A repeated prepare whose spec went missing writes it again.
	os.Remove(filepath.Join(e.dirs.cdi, cdi.SpecName(a.UID)+".json"))
	e.prepareOK(a)
	if _, err := os.Stat(filepath.Join(e.dirs.cdi, cdi.SpecName(a.UID)+".json")); err != nil {
		t.Errorf("repeated prepare did not restore the spec: %v", err)
	}
}

func TestBadClaimFailsOnlyItself(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	good := e.claim(class2x)

	otherPool := e.claim(class2x)
	otherPool.Status.Allocation.Devices.Results[0].Pool = "node-9"
	otherPool = e.update(otherPool)

	unknown := e.claim(class2x)
	unknown.Status.Allocation.Devices.Results[0].Device = "g89-2x"
	unknown = e.update(unknown)

	badConfig := e.claim(class2x)
	badConfig.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver.Name, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig","sharing":"mps"}`)},
		}},
	}}
	badConfig = e.update(badConfig)

	res := e.prepare(good, otherPool, unknown, badConfig)
	if res[string(good.UID)].Error != "" {
		t.Errorf("the good claim failed: %s", res[string(good.UID)].Error)
	}
	wants := map[string]string{
		string(otherPool.UID): `device g01-2x is in pool "node-9", but this node's pool is "node-1"`,
		string(unknown.UID):   "device g89-2x is not published by this node",
		string(badConfig.UID): "sharing: unknown field",
	}
	for uid, want := range wants {
		if got := res[uid].Error; !strings.Contains(got, want) {
			t.Errorf("claim %s: error %q, want it to say %q", uid, got, want)
		}
	}
	// The failed claims left nothing behind and took no seat.
	st, _, _ := checkpoint.NewStore(e.dirs.plugin).Load()
	if len(st.Claims) != 1 {
		t.Errorf("checkpoint holds %d claims, want only the good one", len(st.Claims))
	}
}

func (e *env) update(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	e.t.Helper()
	u, err := e.client.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(e.ctx, c, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// A scheduler that hands out overlapping groups at once (a bug, or state
// it lost) meets the plugin's own guard.
func TestOverlappingGroupsAreRefusedAtPrepare(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	one := e.claim(class1x) // g0-1x
	e.prepareOK(one)
	// Allocated on the per-seat view of the node, which does not know that
	// G0 is in use: the scheduler's view and the node's disagree.
	two := e.claimOn(nodeName+"-per-seat", class2x)
	two.Status.Allocation.Devices.Results[0].Device = "g01-2x"
	two = e.update(two)
	r := e.prepare(two)[string(two.UID)]
	if !strings.Contains(r.Error, "GPU(s) 0,1 of group G01 (2x) are in use by claim default/claim-1") {
		t.Errorf("overlapping prepare: %q", r.Error)
	}
}

func TestPerSeatDevicesAreFixedSeats(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	c := e.claimOn(nodeName+"-per-seat", class2x)
	dev := c.Status.Allocation.Devices.Results[0].Device
	if dev != "g01-2x-seat-0" {
		t.Fatalf("per-seat allocation got %s", dev)
	}
	env, _ := e.container(e.prepareOK(c)...)
	if env["KYB_GPU_GROUP"] != "G01" || env["KYB_GPU_SEAT"] != "0" {
		t.Errorf("env %v", env)
	}
}

func TestHealthStreamReportsEveryDevice(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	stream, err := drahealth.NewDRAResourceHealthClient(e.conn).NodeWatchResources(e.ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // the first report, and a periodic refresh
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Devices) != 12 {
			t.Fatalf("report %d has %d devices, want 12 (8 1x + 4 2x)", i, len(resp.Devices))
		}
		for _, d := range resp.Devices {
			if d.Health != drahealth.HealthStatus_HEALTHY || d.Device.PoolName != nodeName {
				t.Errorf("device %+v", d)
			}
		}
	}
}

func TestLivenessCheckUsesTheRealSockets(t *testing.T) {
	e := newEnv(t, "single-gpu", "")
	if err := e.driver.CheckLive(e.ctx); err != nil {
		t.Fatalf("live plugin fails its check: %v", err)
	}
	e.stop()
	deadline := time.Now().Add(5 * time.Second)
	for e.driver.CheckLive(e.ctx) == nil {
		if time.Now().After(deadline) {
			t.Fatal("a stopped plugin passes its liveness check")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// installLibcuda installs a stand-in libcuda.so.580.95.05 in lib with its
// soname link, as the driver's installer and ldconfig leave them.
func installLibcuda(t *testing.T, lib string) {
	t.Helper()
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libcuda.so.580.95.05"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libcuda.so.580.95.05", filepath.Join(lib, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
}

func TestDriverFilesAndSeatConfigReachTheContainer(t *testing.T) {
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	installLibcuda(t, lib)
	files, err := containeredits.FindDriverFiles(root, "/")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "nvlink-2x4", seed, withOptions(func(o *draplugin.Options) { o.Containers.Edits.Driver = files }))
	c := e.claim(class1x)
	c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{
		{Source: resourceapi.AllocationConfigSourceClass, DeviceConfiguration: opaque(`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig","visibleDevices":"uuid"}`)},
		{Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"gpu"}, DeviceConfiguration: opaque(`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig","visibleDevices":"index"}`)},
		{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "other.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"anything":1}`)}}}},
	}
	c = e.update(c)
	ids := e.prepareOK(c)
	cache, _ := cdiapiCache(e.dirs.cdi)
	spec := ociSpec()
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatal(err)
	}
	// The soname link, where any glibc image's loader looks.
	mounted := 0
	for _, m := range spec.Mounts {
		if (m.Destination == "/usr/lib/x86_64-linux-gnu/libcuda.so.1" || m.Destination == "/usr/lib64/libcuda.so.1") && m.Source == "/usr/lib/x86_64-linux-gnu/libcuda.so.1" {
			mounted++
		}
	}
	if mounted != 2 {
		t.Errorf("libcuda is not mounted: %+v", spec.Mounts)
	}
	env, _ := e.container(ids...)
	if env["CUDA_VISIBLE_DEVICES"] != "0" || env["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" {
		t.Errorf("the claim's config (index) must win over the class's (uuid): %v", env)
	}
}

func opaque(raw string) resourceapi.DeviceConfiguration {
	return resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver.Name, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}
}

func TestRequestForTwoSeatsSeesBoth(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", "profiles: [{resource: kyb.ai/gpu-1x-seat}]\n")
	c := e.claim(class1x, func(r *resourceapi.DeviceRequest) { r.Exactly.Count = 2 })
	if n := len(c.Status.Allocation.Devices.Results); n != 2 {
		t.Fatalf("%d results", n)
	}
	ids := e.prepareOK(c)
	if len(ids) != 2 {
		t.Fatalf("CDI IDs %v", ids)
	}
	for _, id := range ids {
		env, _ := e.container(id)
		if env["KYB_GPU_GROUP"] != "G0,G1" || env["CUDA_VISIBLE_DEVICES"] != e.uuids(0, 1) {
			t.Errorf("device %s: env %v; every device of the request carries both seats", id, env)
		}
	}
	_, devs := e.container(ids...)
	if _, ok := devs["/dev/nvidia1"]; !ok || len(devs) != 5 {
		t.Errorf("device nodes %v", devs)
	}
}

// A driver root that must hold the driver's files but does not yet (a
// driver container still starting) fails the claim's prepare, saying why,
// and the kubelet's retry succeeds once the files are there; the node and
// other claims are not affected.
func TestDriverRootNotReadyFailsOnlyThePrepare(t *testing.T) {
	root := t.TempDir()
	e := newEnv(t, "nvlink-2x4", seed, withOptions(func(o *draplugin.Options) {
		o.Containers.Edits.Driver = containeredits.NewDriverRoot(root, "", true)
	}))
	c := e.claim(class1x)
	res := e.prepare(c)[string(c.UID)]
	if res.GetError() == "" || !strings.Contains(res.GetError(), "no NVIDIA driver libraries under the driver root "+root) {
		t.Fatalf("prepare with no driver yet: %q", res.GetError())
	}
	lib := filepath.Join(root, "usr/lib64")
	installLibcuda(t, lib)
	ids := e.prepareOK(c)
	spec := e.inject(ids...)
	if !slices.ContainsFunc(spec.Mounts, func(m oci.Mount) bool {
		return m.Destination == "/usr/lib64/libcuda.so.1" && m.Source == filepath.Join(lib, "libcuda.so.1")
	}) {
		t.Errorf("the retried prepare mounts no libcuda: %+v", spec.Mounts)
	}
}
