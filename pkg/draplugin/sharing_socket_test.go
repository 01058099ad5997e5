package draplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/api/metadata"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sharedseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// On nvlink-2x4 (80 GiB GPUs): one-seat groups of four seats with MPS,
// pairs of two seats time-sliced with a long slice.
const sharingConfig = `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  sharing: {timeSlicing: {interval: Long}}
`

// withSharing runs the plugin with MPS daemons under root, started with
// control, on the simulated node's GPUs.
func withSharing(root, control string) envOption {
	return func(e *env) {
		host := &gpuhost.Host{NVML: e.sim.NVML(), Simulated: e.sim}
		mgr, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: host.SetExclusive, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
		if err != nil {
			e.t.Fatal(err)
		}
		e.opts = func(o *draplugin.Options) {
			o.Sharing = sharedseats.Options{Hardware: &groupshare.Hardware{Inv: e.inv, MPS: mgr, SetTimeSlice: host.SetTimeSlice}}
			o.DeviceMetadata = true
		}
		e.t.Cleanup(func() {
			// A daemon a test leaves running is stopped with its directory.
			_ = os.RemoveAll(root)
		})
		mpstest.UnmountAtEnd(e.t, root)
	}
}

func seats(n int64) func(*resourceapi.DeviceRequest) {
	return func(r *resourceapi.DeviceRequest) {
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"seats": *resource.NewQuantity(n, resource.DecimalSI)}}
	}
}

// mounts returns a container's bind mounts: destination -> source and
// options.
func (e *env) mounts(ids ...string) map[string]string {
	out := map[string]string{}
	for _, m := range e.inject(ids...).Mounts {
		out[m.Destination] = m.Source + " " + strings.Join(m.Options, ",")
	}
	return out
}

// joinMPS joins the daemon as a container's CUDA process would, with the
// container's MPS environment; the pipe directory is the host's (the
// container's is a bind mount of it).
func joinMPS(t *testing.T, control, hostPipe string, env map[string]string) string {
	t.Helper()
	return mpstest.Join(t, control, hostPipe, env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
}

func TestMPSSeatsHoldTheirSharesOverSockets(t *testing.T) {
	control := mpstest.Build(t)
	root := t.TempDir()
	e := newEnv(t, "nvlink-2x4", sharingConfig, withSharing(root, control))
	dir := filepath.Join(root, "g0-1x")
	pipe := filepath.Join(dir, mps.PipeDir)

	one := e.claim(class1x)
	ids := e.prepareOK(one)
	env, _ := e.container(ids...)
	for k, want := range map[string]string{
		"CUDA_MPS_PIPE_DIRECTORY":           "/tmp/nvidia-mps",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=20480M",
		"CUDA_VISIBLE_DEVICES":              e.uuids(0),
	} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	mounts := e.mounts(ids...)
	if got := mounts["/tmp/nvidia-mps"]; !strings.HasPrefix(got, pipe+" ro,") {
		t.Errorf("pipe directory mount %q, want %s read-only", got, pipe)
	}
	if got := mounts["/dev/shm"]; !strings.HasPrefix(got, filepath.Join(dir, mps.ShmDir)+" rw,") {
		t.Errorf("/dev/shm mount %q, want the daemon's shm directory read-write", got)
	}
	if m := e.sim.ComputeMode(0); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 0 in %s while its daemon runs, want Exclusive_Process", simnode.ComputeModeName(m))
	}
	if m := e.sim.ComputeMode(1); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 1, whose group is not in use, is %s", simnode.ComputeModeName(m))
	}
	if got := joinMPS(t, control, pipe, env); got != "thread=25 mem=0=20480M" {
		t.Errorf("the seat's container got %q from the daemon", got)
	}
	// Its metadata file says the same.
	meta := readMetadata(t, e.metadataMounts(ids...)[metadata.ResourceClaimFilePath("gpu.kyb.ai", one.Name, "gpu")])
	attrs := meta.Requests[0].Devices[0].Attributes
	if v := attrs["sharing"].StringValue; v == nil || *v != "mps" {
		t.Errorf("metadata sharing %v, want mps", v)
	}
	if v := attrs["mpsActiveThreadPercentage"].IntValue; v == nil || *v != 25 {
		t.Errorf("metadata mpsActiveThreadPercentage %v, want 25", v)
	}
	if v := attrs["mpsPinnedDeviceMemLimitMiB"].IntValues; !slices.Equal(v, []int64{20480}) {
		t.Errorf("metadata mpsPinnedDeviceMemLimitMiB %v, want [20480]", v)
	}
	raised := map[string]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
	if got := joinMPS(t, control, pipe, raised); got != "thread=25 mem=0=20480M" {
		t.Errorf("a container that raised its environment got %q, want the seat's share", got)
	}

	// Two seats of the same group: their container gets half, and the
	// daemon allows half.
	two := e.claim(class1x, seats(2))
	if dev := two.Status.Allocation.Devices.Results[0].Device; dev != "g0-1x" {
		t.Fatalf("two seats allocated on %s, want g0-1x beside the first", dev)
	}
	env2, _ := e.container(e.prepareOK(two)...)
	if env2["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "50" || env2["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=40960M" {
		t.Errorf("two seats' container: %s, %s", env2["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env2["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
	if got := joinMPS(t, control, pipe, env2); got != "thread=50 mem=0=40960M" {
		t.Errorf("the two seats' container got %q", got)
	}
	if got := joinMPS(t, control, pipe, env); got != "thread=25 mem=0=20480M" {
		t.Errorf("the one seat's container got %q beside two seats", got)
	}

	// Its release brings the daemon back to one seat's share; the last
	// release stops it and gives the GPU back in compute mode DEFAULT.
	e.unprepare(two)
	if last := mpstest.LastCommand(t, filepath.Join(dir, mps.LogDir), "set_default_active_thread_percentage"); last != "set_default_active_thread_percentage 25" {
		t.Errorf("after the two seats went, the daemon's last default is %q (commands %q)", last, mpstest.Commands(t, filepath.Join(dir, mps.LogDir)))
	}
	e.unprepare(one)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory is left after the group's last seat went: %v", err)
	}
	if m := e.sim.ComputeMode(0); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 0 is %s after its daemon stopped", simnode.ComputeModeName(m))
	}
}

// An mps profile that keeps the compute mode: the seat's daemon starts,
// holds the seat's share and stops, and the GPU's compute mode, set to
// EXCLUSIVE_PROCESS by the node's operator before, is never set by the
// plugin.
func TestMPSSeatsThatKeepTheComputeModeOverSockets(t *testing.T) {
	control := mpstest.Build(t)
	root := t.TempDir()
	e := newEnv(t, "nvlink-2x4", `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps, mps: {computeMode: keep}}
`, withSharing(root, control))
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS || dev.SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS) != nvml.SUCCESS {
		t.Fatal("set GPU 0's compute mode as its operator would")
	}
	operators := len(e.sim.SharingChanges())
	dir := filepath.Join(root, "g0-1x")

	one := e.claim(class1x)
	env, _ := e.container(e.prepareOK(one)...)
	if env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=20480M" {
		t.Errorf("the seat's container: %s, %s", env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
	raised := map[string]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
	if got := joinMPS(t, control, filepath.Join(dir, mps.PipeDir), raised); got != "thread=25 mem=0=20480M" {
		t.Errorf("a container that raised its environment got %q, want the seat's share", got)
	}
	e.unprepare(one)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory is left after the group's last seat went: %v", err)
	}
	if changes := e.sim.SharingChanges()[operators:]; len(changes) > 0 {
		t.Errorf("the plugin changed the GPUs' settings: %+v", changes)
	}
	if m := e.sim.ComputeMode(0); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 0 is %s, want Exclusive_Process as its operator left it", simnode.ComputeModeName(m))
	}
}

// A restarted plugin adopts the daemon of a group in use (its containers
// keep their server) and stops one no claim uses any more.
func TestAPluginRestartAdoptsTheDaemon(t *testing.T) {
	control := mpstest.Build(t)
	root := t.TempDir()
	e := newEnv(t, "nvlink-2x4", sharingConfig, withSharing(root, control))
	one := e.claim(class1x)
	e.prepareOK(one)
	// A daemon of a group no claim holds, left by a plugin that went away.
	mgr, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: func(context.Context, string, bool) error { return nil }, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Ensure(e.ctx, mps.Group{Name: "g7-1x", UUIDs: []string{e.uuids(7)}}, mps.Fixed(mps.Share(1, 4, []int64{81920}))); err != nil {
		t.Fatal(err)
	}

	e.restart()
	log, err := os.ReadFile(filepath.Join(root, "g0-1x", mps.LogDir, "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "Control daemon started"); n != 1 {
		t.Errorf("g0-1x's daemon started %d times, want once: adopted after the restart", n)
	}
	if _, err := os.Stat(filepath.Join(root, "g7-1x")); !os.IsNotExist(err) {
		t.Errorf("the daemon of a group no claim holds is left after the restart: %v", err)
	}
	another := e.claim(class1x)
	env, _ := e.container(e.prepareOK(another)...)
	if got := joinMPS(t, control, filepath.Join(root, "g0-1x", mps.PipeDir), env); got != "thread=25 mem=0=20480M" {
		t.Errorf("a seat prepared after the restart got %q", got)
	}
	e.unprepare(one, another)
	if _, err := os.Stat(filepath.Join(root, "g0-1x")); !os.IsNotExist(err) {
		t.Errorf("the adopted daemon is left after its group's last release: %v", err)
	}
}

// A daemon that will not start fails its claim's prepare, with its words,
// and nothing else: a time-sliced claim on the same node prepares, with
// its interval applied to its GPUs.
func TestADaemonThatWillNotStartFailsItsClaimOnly(t *testing.T) {
	script := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'MPS is not supported on this GPU' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "nvlink-2x4", sharingConfig, withSharing(t.TempDir(), script))
	bad := e.claim(class1x)
	r := e.prepare(bad)[string(bad.UID)]
	if r == nil || !strings.Contains(r.Error, "start MPS daemon g0-1x") || !strings.Contains(r.Error, "MPS is not supported on this GPU") {
		t.Fatalf("prepare of a seat whose daemon fails: %+v", r)
	}
	evs := claimEvents(t, e, bad, 1)
	if len(evs) == 0 || evs[0].Reason != "PrepareFailed" || !strings.Contains(evs[0].Note, "MPS is not supported") {
		t.Errorf("events %+v, want PrepareFailed with the daemon's words", evs)
	}
	if m := e.sim.ComputeMode(0); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 0 left in %s by a daemon that did not start", simnode.ComputeModeName(m))
	}

	pair := e.claim(class2x)
	e.prepareOK(pair)
	var slicesSet []simnode.SharingChange
	for _, c := range e.sim.SharingChanges() {
		if c.What == "timeSlice" {
			slicesSet = append(slicesSet, c)
		}
	}
	g := e.plan.GroupByDevice(pair.Status.Allocation.Devices.Results[0].Device)
	want := []simnode.SharingChange{{GPU: g.GPUs[0], What: "timeSlice", Value: "3"}, {GPU: g.GPUs[1], What: "timeSlice", Value: "3"}}
	if !slices.Equal(slicesSet, want) {
		t.Errorf("time slices set %+v, want %+v (Long on the pair's GPUs)", slicesSet, want)
	}
}
