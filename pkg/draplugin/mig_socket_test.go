package draplugin_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// These tests prepare MIG seats through the plugin's real gRPC sockets,
// on a simulated node whose GPUs partition themselves as real ones do.

const (
	classMIG1g = "mig-1g.10gb.kyb.ai"
	classMIG2g = "mig-2g.20gb.kyb.ai"
)

const migConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}
- {resource: kyb.ai/mig-2g.20gb, mig: {profile: 2g.20gb}, gpus: [0]}
`

// crashPoint stops the plugin's next making or destruction of an instance
// at a named step, once, as a crash would.
type crashPoint struct {
	mu   sync.Mutex
	step string
}

func (c *crashPoint) arm(step string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.step = step
}

func (c *crashPoint) at(step string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.step != "" && c.step == step {
		c.step = ""
		return true
	}
	return false
}

// withMIG gives the plugin the simulated node's NVML and mig-minors.
func withMIG(crash *crashPoint) envOption {
	return func(e *env) {
		e.opts = func(o *draplugin.Options) {
			o.MIG = migseats.Options{NVML: e.sim.NVML(), Minors: func() ([]byte, error) { return e.sim.MIGMinorsFile(), nil }, Step: crash.at}
		}
	}
}

// gpu0Instances lists GPU 0's GPU instances through NVML as
// "profileID@{start}:size", sorted.
func (e *env) gpu0Instances() []string {
	e.t.Helper()
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	var out []string
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			return nil
		}
		for _, gi := range gis {
			g, _ := gi.GetInfo()
			out = append(out, fmt.Sprintf("%d@{%d}:%d", g.ProfileId, g.Placement.Start, g.Placement.Size))
		}
	}
	slices.Sort(out)
	return out
}

// migClaimOn allocates a claim of class and then makes its allocation
// name device instead, as an allocation gone stale would.
func (e *env) migClaimOn(class, device string) *resourceapi.ResourceClaim {
	e.t.Helper()
	e.claimN++
	c := schedulertest.Claim(fmt.Sprintf("claim-%d", e.claimN), class, 1)
	c.UID = types.UID(fmt.Sprintf("0000000%d-1111-2222-3333-444444444444", e.claimN))
	alloc, err := e.cluster.Allocate(e.ctx, c, nodeName)
	if err != nil || alloc == nil {
		e.t.Fatalf("allocate %s: %v %v", class, alloc, err)
	}
	alloc.Devices.Results[0].Pool = nodeName
	alloc.Devices.Results[0].Device = device
	c.Status.Allocation = alloc
	return e.store(c)
}

func TestMIGClaimPreparedAndUnpreparedOverSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	claim := e.claim(classMIG1g)
	if got := claim.Status.Allocation.Devices.Results[0].Device; got != "g0-mig-1g-10gb-6" {
		t.Fatalf("allocated %s, want g0-mig-1g-10gb-6", got)
	}
	ids := e.prepareOK(claim)
	if got, want := e.gpu0Instances(), []string{"19@{6}:1"}; !slices.Equal(got, want) {
		t.Fatalf("GPU 0's instances = %v, want %v (MIG mode switched on at prepare on Hopper)", got, want)
	}
	env, devs := e.container(ids...)
	uuid := env["CUDA_VISIBLE_DEVICES"]
	if !strings.HasPrefix(uuid, "MIG-") || env["NVIDIA_VISIBLE_DEVICES"] != uuid {
		t.Errorf("CUDA_VISIBLE_DEVICES=%q NVIDIA_VISIBLE_DEVICES=%q, want one MIG- UUID in both", uuid, env["NVIDIA_VISIBLE_DEVICES"])
	}
	for k, want := range map[string]string{"KYB_GPU_GROUP": "G0", "KYB_GPU_SEAT": "6", "KYB_SEAT_GEN": "1"} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	nodes, err := e.sim.MIGDeviceNodes(uuid)
	if err != nil {
		t.Fatalf("the container's MIG device: %v", err)
	}
	for _, n := range nodes {
		d, ok := devs[n.Path]
		if !ok || d.Major != n.Major || d.Minor != n.Minor {
			t.Errorf("device node %s (%d:%d): the container has %+v", n.Path, n.Major, n.Minor, d)
		}
	}
	if len(devs) != len(nodes) {
		t.Errorf("the container has %d device nodes, want the instance's %d: %v", len(devs), len(nodes), devs)
	}
	// A repeated prepare answers the same instance.
	if again := e.prepareOK(claim); !slices.Equal(again, ids) {
		t.Errorf("repeated prepare: %v, want %v", again, ids)
	}
	for i := range 2 {
		if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
			t.Fatalf("unprepare #%d: %+v", i+1, r)
		}
		if got := e.gpu0Instances(); len(got) != 0 {
			t.Errorf("after unprepare #%d: instances %v, want none", i+1, got)
		}
	}
}

func TestMIGOverlappingStaleAllocationFailsCleanly(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	two := e.claim(classMIG2g)
	if got := two.Status.Allocation.Devices.Results[0].Device; got != "g0-mig-2g-20gb-4" {
		t.Fatalf("allocated %s, want g0-mig-2g-20gb-4", got)
	}
	ids := e.prepareOK(two)
	stale := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-5")
	r := e.prepare(stale)[string(stale.UID)]
	if r == nil || !strings.Contains(r.Error, "ERROR_INSUFFICIENT_RESOURCES") {
		t.Fatalf("prepare of an overlapping placement: %+v, want a failure naming ERROR_INSUFFICIENT_RESOURCES", r)
	}
	if got, want := e.gpu0Instances(), []string{"14@{4}:2"}; !slices.Equal(got, want) {
		t.Errorf("instances = %v, want the first claim's alone %v", got, want)
	}
	if env, _ := e.container(ids...); !strings.HasPrefix(env["CUDA_VISIBLE_DEVICES"], "MIG-") {
		t.Errorf("the first claim's container: %v", env)
	}
	if r := e.unprepare(stale)[string(stale.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare of the failed claim: %+v", r)
	}
	if got, want := e.gpu0Instances(), []string{"14@{4}:2"}; !slices.Equal(got, want) {
		t.Errorf("after the failed claim's unprepare: instances = %v, want %v", got, want)
	}
	if r := e.unprepare(two)[string(two.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	if got := e.gpu0Instances(); len(got) != 0 {
		t.Errorf("instances = %v, want none", got)
	}
}

// TestMIGRestartBetweenCreateAndRecord stops the plugin after the
// instance is made and before the journal says so; the restarted plugin
// destroys the half-made instance and the kubelet's retry makes one.
func TestMIGRestartBetweenCreateAndRecord(t *testing.T) {
	crash := &crashPoint{}
	e := newEnv(t, "dgx-h100", migConfig, withMIG(crash))
	claim := e.claim(classMIG1g)
	crash.arm("record created")
	if r := e.prepare(claim)[string(claim.UID)]; r == nil || r.Error == "" {
		t.Fatalf("prepare stopped before its record: %+v, want a failure", r)
	}
	if got, want := e.gpu0Instances(), []string{"19@{6}:1"}; !slices.Equal(got, want) {
		t.Fatalf("before the restart: instances = %v, want the half-made %v", got, want)
	}
	e.restart()
	if got := e.gpu0Instances(); len(got) != 0 {
		t.Errorf("after the restart: instances = %v, want the half-made one destroyed", got)
	}
	ids := e.prepareOK(claim)
	if got, want := e.gpu0Instances(), []string{"19@{6}:1"}; !slices.Equal(got, want) {
		t.Errorf("after the retried prepare: instances = %v, want %v", got, want)
	}
	env, _ := e.container(ids...)
	if _, err := e.sim.MIGDeviceNodes(env["CUDA_VISIBLE_DEVICES"]); err != nil {
		t.Errorf("the container's MIG device %q is not live: %v", env["CUDA_VISIBLE_DEVICES"], err)
	}
	if env["KYB_GPU_SEAT"] != "6" || env["KYB_SEAT_GEN"] != "1" {
		t.Errorf("seat %q generation %q, want 6 and 1: one seat, not handed out twice", env["KYB_GPU_SEAT"], env["KYB_SEAT_GEN"])
	}
	if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	if got := e.gpu0Instances(); len(got) != 0 {
		t.Errorf("instances = %v, want none", got)
	}
}

// TestMIGForeignPartitionUntouched: a partition an administrator made is
// left alone by a start, a prepare beside it, an unprepare and another
// start.
func TestMIGForeignPartitionUntouched(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	dev, _ := e.sim.NVML().DeviceGetHandleByIndex(0)
	if act, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS {
		t.Fatal(act, ret)
	}
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 1, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	foreign := []string{"19@{0}:1", "19@{1}:1"}
	e.restart()
	if got := e.gpu0Instances(); !slices.Equal(got, foreign) {
		t.Fatalf("after a start: instances = %v, want the foreign %v untouched", got, foreign)
	}
	claim := e.claim(classMIG1g)
	e.prepareOK(claim)
	if got, want := e.gpu0Instances(), []string{"19@{0}:1", "19@{1}:1", "19@{6}:1"}; !slices.Equal(got, want) {
		t.Errorf("after a prepare: instances = %v, want %v", got, want)
	}
	if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	e.restart()
	if got := e.gpu0Instances(); !slices.Equal(got, foreign) {
		t.Errorf("after an unprepare and a start: instances = %v, want the foreign %v", got, foreign)
	}
}

// TestMIGOnAmpereWithMIGOffFailsTheClaimNotTheNode: the claim's prepare
// says a GPU reset is needed and how; the node's other seats prepare.
func TestMIGOnAmpereWithMIGOffFailsTheClaimNotTheNode(t *testing.T) {
	e := newEnv(t, "dgx-a100", `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.5gb, mig: {profile: 1g.5gb}, gpus: [0]}
`, withMIG(&crashPoint{}))
	claim := e.claim("mig-1g.5gb.kyb.ai")
	r := e.prepare(claim)[string(claim.UID)]
	if r == nil || !strings.Contains(r.Error, "--gpu-reset") || !strings.Contains(r.Error, "nvidia-smi -i 0 -mig 1") {
		t.Fatalf("prepare with MIG off on an A100: %+v, want a failure saying to turn MIG on and reset the GPU", r)
	}
	other := e.claim("gpu-1x-seat.kyb.ai")
	e.prepareOK(other)
}

// TestMIGInstancesOfTwoProfilesShareAGPU: instances of two MIG profiles
// on one GPU do not exclude each other as two groups on one GPU do.
func TestMIGInstancesOfTwoProfilesShareAGPU(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	two := e.claim(classMIG2g)
	one := e.claim(classMIG1g)
	e.prepareOK(two)
	e.prepareOK(one)
	if got, want := e.gpu0Instances(), []string{"14@{4}:2", "19@{6}:1"}; !slices.Equal(got, want) {
		t.Errorf("instances = %v, want %v", got, want)
	}
	for _, c := range []*resourceapi.ResourceClaim{two, one} {
		if r := e.unprepare(c)[string(c.UID)]; r == nil || r.Error != "" {
			t.Fatalf("unprepare %s: %+v", c.Name, r)
		}
	}
	if got := e.gpu0Instances(); len(got) != 0 {
		t.Errorf("instances = %v, want none", got)
	}
}

// TestMIGRestartAtEveryStep stops the plugin at each step of a MIG
// claim's prepare, and then of its unprepare, restarts it and lets the
// kubelet retry, beside a partition an administrator made on the same
// GPU: the claim's instance is made once, its seat is held once (the
// next holder's generation is the next one), nothing is left behind, and
// the administrator's partition stays.
func TestMIGRestartAtEveryStep(t *testing.T) {
	prepareSteps := []string{"SetMigMode", "record creating", "CreateGpuInstanceWithPlacement", "GpuInstance.GetInfo", "record GPU instance",
		"GetComputeInstanceProfileInfo", "record compute instance", "CreateComputeInstance", "ComputeInstance.GetInfo", "read MIG UUID", "record created"}
	unprepareSteps := []string{"find GPU instance", "ComputeInstance.Destroy", "GpuInstance.Destroy", "forget destroyed"}
	for _, step := range append(prepareSteps, unprepareSteps...) {
		t.Run(step, func(t *testing.T) {
			crash := &crashPoint{}
			e := newEnv(t, "dgx-h100", migConfig, withMIG(crash))
			var foreign []string
			if step != "SetMigMode" {
				// An administrator's partition (MIG mode on already).
				dev, _ := e.sim.NVML().DeviceGetHandleByIndex(0)
				if act, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS {
					t.Fatal(act, ret)
				}
				info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
				if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.SUCCESS {
					t.Fatal(ret)
				}
				foreign = []string{"19@{0}:1"}
			}
			claim := e.claim(classMIG1g)
			if slices.Contains(prepareSteps, step) {
				crash.arm(step)
				if r := e.prepare(claim)[string(claim.UID)]; r == nil || r.Error == "" {
					t.Fatalf("prepare stopped at %s: %+v, want a failure", step, r)
				}
				e.restart()
			}
			ids := e.prepareOK(claim)
			if got, want := e.gpu0Instances(), append(slices.Clone(foreign), "19@{6}:1"); !slices.Equal(got, want) {
				t.Fatalf("after the prepare: instances %v, want %v", got, want)
			}
			env, _ := e.container(ids...)
			if _, err := e.sim.MIGDeviceNodes(env["CUDA_VISIBLE_DEVICES"]); err != nil || env["KYB_SEAT_GEN"] != "1" {
				t.Errorf("the container's MIG device %q (generation %q): %v", env["CUDA_VISIBLE_DEVICES"], env["KYB_SEAT_GEN"], err)
			}
			if slices.Contains(unprepareSteps, step) {
				crash.arm(step)
				if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error == "" {
					t.Fatalf("unprepare stopped at %s: %+v, want a failure", step, r)
				}
				e.restart()
			}
			if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
				t.Fatalf("unprepare: %+v", r)
			}
			if got := e.gpu0Instances(); !slices.Equal(got, foreign) {
				t.Fatalf("after the unprepare: instances %v, want the administrator's %v alone", got, foreign)
			}
			// The seat is free again, once: the next claim at the same
			// placement (the test's allocator still counts the first
			// claim's) gets it with the next generation.
			next := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-6")
			env, _ = e.container(e.prepareOK(next)...)
			if env["KYB_GPU_SEAT"] != "6" || env["KYB_SEAT_GEN"] != "2" {
				t.Errorf("the next claim: seat %q generation %q, want 6 and 2", env["KYB_GPU_SEAT"], env["KYB_SEAT_GEN"])
			}
		})
	}
}
