package draplugin_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// migMode reads GPU 0's current MIG mode through NVML.
func (e *env) gpu0MIGMode() int {
	e.t.Helper()
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	current, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	return current
}

// TestWholeGPUSeatAfterMIGSeatsTurnsMIGModeOff prepares, over the real
// sockets, a 1x group on a Hopper GPU whose MIG seats had turned MIG mode
// on and were released: a container given a GPU in MIG mode whole sees no
// CUDA device, so the prepare turns MIG mode off (the GPU holds no
// instance and Hopper switches at once), and a MIG seat's prepare turns
// it on again.
func TestWholeGPUSeatAfterMIGSeatsTurnsMIGModeOff(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	mig := e.claim(classMIG1g)
	e.prepareOK(mig)
	if got := e.gpu0MIGMode(); got != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode after a MIG seat's prepare: %d, want on", got)
	}
	if r := e.unprepare(mig)[string(mig.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	whole := e.migClaimOn(class1x, "g0-1x")
	e.prepareOK(whole)
	if got := e.gpu0MIGMode(); got != nvml.DEVICE_MIG_DISABLE {
		t.Errorf("MIG mode after the 1x group's prepare: %d, want off (the container gets the GPU whole)", got)
	}
	if r := e.unprepare(whole)[string(whole.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	again := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-6")
	e.prepareOK(again)
	if got := e.gpu0MIGMode(); got != nvml.DEVICE_MIG_ENABLE {
		t.Errorf("MIG mode after the next MIG seat's prepare: %d, want on", got)
	}
}

// TestWholeGPUSeatOnGPUWithMIGInstanceFails prepares a 1x group on a GPU
// an administrator partitioned after the plugin started: the prepare
// fails naming the instance, which stays, and MIG mode stays on.
func TestWholeGPUSeatOnGPUWithMIGInstanceFails(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || activation != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v %v", ret, activation)
	}
	info, ret := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	whole := e.migClaimOn(class1x, "g0-1x")
	r := e.prepare(whole)[string(whole.UID)]
	if r == nil || !strings.Contains(r.Error, "MIG instance") {
		t.Fatalf("prepare of a 1x group on a partitioned GPU: %+v, want a failure naming the MIG instance", r)
	}
	if got, want := e.gpu0Instances(), []string{"19@{0}:1"}; !slices.Equal(got, want) {
		t.Errorf("instances = %v, want the administrator's %v", got, want)
	}
	if got := e.gpu0MIGMode(); got != nvml.DEVICE_MIG_ENABLE {
		t.Errorf("MIG mode: %d, want on", got)
	}
}
