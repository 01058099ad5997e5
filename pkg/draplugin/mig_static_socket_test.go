package draplugin_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
)

// These tests start the plugin over its real sockets on a simulated H100
// node where an administrator partitioned GPU 0 before the start.

// partition makes, as an administrator with nvidia-smi would, a GPU
// instance of profile index at {start}:size on GPU 0, with a compute instance
// spanning it if whole, and returns its MIG device's UUID ("" without).
func (e *env) partition(index, start, size int, whole bool) string {
	e.t.Helper()
	dev, _ := e.sim.NVML().DeviceGetHandleByIndex(0)
	if cur, _, _ := dev.GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE {
		if act, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS {
			e.t.Fatal(act, ret)
		}
	}
	info, ret := dev.GetGpuInstanceProfileInfo(index)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(size)})
	if ret != nvml.SUCCESS {
		e.t.Fatalf("make a GPU instance of profile index %d at %d: %v", index, start, ret)
	}
	if !whole {
		return ""
	}
	ciIndex := map[uint32]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[info.SliceCount]
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciIndex, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	gInfo, _ := gi.GetInfo()
	cInfo, _ := ci.GetInfo()
	n, _ := dev.GetMaxMigDeviceCount()
	for i := range n {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g, _ := md.GetGpuInstanceId()
		c, _ := md.GetComputeInstanceId()
		if g == int(gInfo.Id) && c == int(cInfo.Id) {
			uuid, _ := md.GetUUID()
			return uuid
		}
	}
	e.t.Fatal("no MIG device for the compute instance just made")
	return ""
}

// staticDevices lists the published devices marked static.
func staticDevices(t *testing.T, e *env) []string {
	t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[draresources.AttrStatic]; ok && a.BoolValue != nil && *a.BoolValue {
				out = append(out, d.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// waitPublished waits until the plugin's slices hold none of absent and
// exactly static as static devices.
func waitStatic(t *testing.T, e *env, absent, static []string) {
	t.Helper()
	waitFor(t, "the slices to withdraw "+strings.Join(absent, ", ")+" and mark "+strings.Join(static, ", "), func() bool {
		pub := publishedDevices(t, e)
		return len(pub) > 0 && !slices.ContainsFunc(absent, func(d string) bool { return slices.Contains(pub, d) }) &&
			slices.Equal(staticDevices(t, e), static)
	})
}

// TestMIGStaticSeatPreparedOverSockets: a 1g.10gb instance an
// administrator made at slice 0 is published as a static seat; a claim
// allocated it gets that instance (its MIG UUID and capability nodes), a
// restart with the claim held keeps it, and the unprepare leaves the
// instance, which stays a static seat across another start.
func TestMIGStaticSeatPreparedOverSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	uuid := e.partition(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1, true)
	layout := []string{"19@{0}:1"}
	e.restart()
	waitStatic(t, e, []string{"g0-1x", "g0-mig-2g-20gb-0"}, []string{"g0-mig-1g-10gb-0"})
	if pub := publishedDevices(t, e); !slices.Contains(pub, "g0-mig-1g-10gb-1") || !slices.Contains(pub, "g0-mig-2g-20gb-2") || !slices.Contains(pub, "g1-1x") {
		t.Errorf("published %v, want the placements beside the static seat and the other GPUs' groups", pub)
	}
	claim := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-0")
	ids := e.prepareOK(claim)
	env, devs := e.container(ids...)
	if env["CUDA_VISIBLE_DEVICES"] != uuid || env["NVIDIA_VISIBLE_DEVICES"] != uuid || env["KYB_GPU_SEAT"] != "0" {
		t.Errorf("CUDA_VISIBLE_DEVICES=%q NVIDIA_VISIBLE_DEVICES=%q KYB_GPU_SEAT=%q, want the static instance's %s and seat 0",
			env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"], env["KYB_GPU_SEAT"], uuid)
	}
	nodes, err := e.sim.MIGDeviceNodes(uuid)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if d, ok := devs[n.Path]; !ok || d.Major != n.Major || d.Minor != n.Minor {
			t.Errorf("device node %s (%d:%d): the container has %+v", n.Path, n.Major, n.Minor, d)
		}
	}
	if got := e.gpu0Instances(); !slices.Equal(got, layout) {
		t.Errorf("after the prepare: instances %v, want %v", got, layout)
	}
	e.restart()
	waitStatic(t, e, []string{"g0-1x"}, []string{"g0-mig-1g-10gb-0"})
	if again := e.prepareOK(claim); !slices.Equal(again, ids) {
		t.Errorf("prepare after a restart with the claim held: %v, want %v", again, ids)
	}
	if env, _ := e.container(ids...); env["CUDA_VISIBLE_DEVICES"] != uuid {
		t.Errorf("after a restart: CUDA_VISIBLE_DEVICES=%q, want %s", env["CUDA_VISIBLE_DEVICES"], uuid)
	}
	for i := range 2 {
		if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
			t.Fatalf("unprepare #%d: %+v", i+1, r)
		}
		if got := e.gpu0Instances(); !slices.Equal(got, layout) {
			t.Errorf("after unprepare #%d: instances %v, want the static %v kept", i+1, got, layout)
		}
	}
	e.restart()
	waitStatic(t, e, []string{"g0-1x"}, []string{"g0-mig-1g-10gb-0"})
	next := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-0")
	env, _ = e.container(e.prepareOK(next)...)
	if env["CUDA_VISIBLE_DEVICES"] != uuid || env["KYB_SEAT_GEN"] != "2" {
		t.Errorf("the next claim: CUDA_VISIBLE_DEVICES=%q generation %q, want %s and 2", env["CUDA_VISIBLE_DEVICES"], env["KYB_SEAT_GEN"], uuid)
	}
}

// TestMIGForeignPartitionWithdrawnAndReported: an instance without a
// compute instance and one of a profile GPU 0 is not configured for are
// no seats: the devices they overlap and GPU 0's whole-GPU groups are not
// published, a Node event names them, and neither is destroyed by starts,
// a claim's prepare and unprepare beside them.
func TestMIGForeignPartitionWithdrawnAndReported(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	e.partition(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, false)
	e.partition(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4, 4, true)
	layout := []string{"19@{1}:1", "9@{4}:4"}
	if got := e.gpu0Instances(); !slices.Equal(got, layout) {
		t.Fatalf("instances %v, want %v", got, layout)
	}
	e.restart()
	withdrawn := []string{"g0-1x", "g01-2x", "g0-mig-1g-10gb-1", "g0-mig-1g-10gb-4", "g0-mig-1g-10gb-5", "g0-mig-1g-10gb-6",
		"g0-mig-2g-20gb-0", "g0-mig-2g-20gb-4"}
	waitStatic(t, e, withdrawn, nil)
	pub := publishedDevices(t, e)
	for _, d := range []string{"g0-mig-1g-10gb-0", "g0-mig-1g-10gb-2", "g0-mig-1g-10gb-3", "g0-mig-2g-20gb-2", "g1-1x"} {
		if !slices.Contains(pub, d) {
			t.Errorf("%s is not published; it can be made beside the foreign instances: %v", d, pub)
		}
	}
	if note := nodeEvent(t, e, migseats.ReasonForeignMIGInstance); !strings.Contains(note, "not made by the plugin") {
		t.Errorf("Node event %s: %q, want one naming a foreign instance", migseats.ReasonForeignMIGInstance, note)
	}
	claim := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-2")
	e.prepareOK(claim)
	if got, want := e.gpu0Instances(), []string{"19@{1}:1", "19@{2}:1", "9@{4}:4"}; !slices.Equal(got, want) {
		t.Errorf("after a prepare: instances %v, want %v", got, want)
	}
	if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	e.restart()
	if got := e.gpu0Instances(); !slices.Equal(got, layout) {
		t.Errorf("after an unprepare and a start: instances %v, want the foreign %v", got, layout)
	}
}

// TestMIGRestartAtEveryStepOfAdoption stops the plugin at each step of a
// static seat's adoption, and then of its release, restarts it and lets
// the kubelet retry: the static instance is never destroyed, the claim
// gets it, and the seat is free again once.
func TestMIGRestartAtEveryStepOfAdoption(t *testing.T) {
	prepareSteps := []string{"find static instance", "read static MIG UUID", "record adopted"}
	unprepareSteps := []string{"forget destroyed"}
	for _, step := range append(prepareSteps, unprepareSteps...) {
		t.Run(step, func(t *testing.T) {
			crash := &crashPoint{}
			e := newEnv(t, "dgx-h100", migConfig, withMIG(crash))
			uuid := e.partition(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1, true)
			layout := []string{"19@{0}:1"}
			e.restart()
			claim := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-0")
			if slices.Contains(prepareSteps, step) {
				crash.arm(step)
				if r := e.prepare(claim)[string(claim.UID)]; r == nil || r.Error == "" {
					t.Fatalf("prepare stopped at %s: %+v, want a failure", step, r)
				}
				e.restart()
				if got := e.gpu0Instances(); !slices.Equal(got, layout) {
					t.Fatalf("after the restart: instances %v, want %v", got, layout)
				}
			}
			env, _ := e.container(e.prepareOK(claim)...)
			if env["CUDA_VISIBLE_DEVICES"] != uuid || env["KYB_SEAT_GEN"] != "1" {
				t.Errorf("the claim's CUDA_VISIBLE_DEVICES=%q generation %q, want %s and 1", env["CUDA_VISIBLE_DEVICES"], env["KYB_SEAT_GEN"], uuid)
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
			if got := e.gpu0Instances(); !slices.Equal(got, layout) {
				t.Fatalf("after the unprepare: instances %v, want the static %v", got, layout)
			}
			e.restart()
			waitStatic(t, e, []string{"g0-1x"}, []string{"g0-mig-1g-10gb-0"})
			next := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-0")
			env, _ = e.container(e.prepareOK(next)...)
			if env["CUDA_VISIBLE_DEVICES"] != uuid || env["KYB_SEAT_GEN"] != "2" {
				t.Errorf("the next claim: CUDA_VISIBLE_DEVICES=%q generation %q, want %s and 2", env["CUDA_VISIBLE_DEVICES"], env["KYB_SEAT_GEN"], uuid)
			}
		})
	}
}
