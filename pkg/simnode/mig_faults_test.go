package simnode

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestFailCallRefusesBadFaults(t *testing.T) {
	n, err := Load("dgx-h100", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		f   CallFault
		err string
	}{
		{CallFault{Call: "CreateGpuInstanceEverywhere", Nth: 1, Ret: nvml.ERROR_UNKNOWN}, `cannot fail NVML call "CreateGpuInstanceEverywhere": calls are any MIG call, GetMigMode, SetMigMode`},
		{CallFault{Call: CallSetMigMode, Nth: 0, Ret: nvml.ERROR_UNKNOWN}, "fail call SetMigMode: Nth is 0, want 1 or more"},
		{CallFault{Call: CallSetMigMode, Nth: 1, Ret: nvml.SUCCESS}, "fail call SetMigMode: the answer is SUCCESS, want an error"},
	} {
		if err := n.FailCall(tt.f); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("FailCall(%+v): %v, want %q", tt.f, err, tt.err)
		}
	}
}

func TestFailCallFailsTheNthCall(t *testing.T) {
	n, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	if err := n.FailCall(CallFault{Call: CallCreateGpuInstanceWithPlacement, Nth: 2, Ret: nvml.ERROR_UNKNOWN}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []nvml.Return{nvml.SUCCESS, nvml.ERROR_UNKNOWN, nvml.SUCCESS} {
		if _, ret := createGI(t, d, m, "1g.10gb", i); ret != want {
			t.Errorf("call %d: %v, want %v", i+1, ret, want)
		}
	}
	if got := n.CallCount(CallCreateGpuInstanceWithPlacement); got != 3 {
		t.Errorf("CallCount = %d, want 3", got)
	}
	if got, want := layout(n, 0), "mode 1/1; GI 7 1g.10gb@{0}:1; GI 9 1g.10gb@{2}:1"; got != want {
		t.Errorf("%s, want %s", got, want)
	}
}

// migFixture is GPU 0 of an H100 node with MIG on, a 3g.40gb at {4}:4
// with its compute instance and MIG device, and an empty 1g.10gb at
// {0}:1.
type migFixture struct {
	n      *Node
	d      nvml.Device
	gi     nvml.GpuInstance
	ci     nvml.ComputeInstance
	md     nvml.Device
	empty  nvml.GpuInstance
	info1g nvml.GpuInstanceProfileInfo
	ciInfo nvml.ComputeInstanceProfileInfo
}

func newMIGFixture(t *testing.T) *migFixture {
	t.Helper()
	n, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	f := &migFixture{n: n, d: d, info1g: profileInfo(t, d, m, "1g.10gb")}
	var ret nvml.Return
	if f.gi, ret = createGI(t, d, m, "3g.40gb", 4); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if f.ci, ret = fullCI(t, f.gi); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if f.md, ret = d.GetMigDeviceHandleByIndex(0); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if f.empty, ret = createGI(t, d, m, "1g.10gb", 0); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	f.ciInfo, _ = f.empty.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
	return f
}

// TestMIGInjectedFailureAtEachCall fails each MIG call once: it answers
// the injected code, changes nothing (a failed CreateComputeInstance
// leaves its GPU instance, as on real hardware), and the next call
// answers normally.
func TestMIGInjectedFailureAtEachCall(t *testing.T) {
	calls := map[Call]func(f *migFixture) nvml.Return{
		CallGetMigMode:                func(f *migFixture) nvml.Return { _, _, ret := f.d.GetMigMode(); return ret },
		CallSetMigMode:                func(f *migFixture) nvml.Return { _, ret := f.d.SetMigMode(nvml.DEVICE_MIG_DISABLE); return ret },
		CallGetGpuInstanceProfileInfo: func(f *migFixture) nvml.Return { _, ret := f.d.GetGpuInstanceProfileInfo(0); return ret },
		CallGetGpuInstancePossiblePlacements: func(f *migFixture) nvml.Return {
			_, ret := f.d.GetGpuInstancePossiblePlacements(&f.info1g)
			return ret
		},
		CallCreateGpuInstance: func(f *migFixture) nvml.Return { _, ret := f.d.CreateGpuInstance(&f.info1g); return ret },
		CallCreateGpuInstanceWithPlacement: func(f *migFixture) nvml.Return {
			_, ret := f.d.CreateGpuInstanceWithPlacement(&f.info1g, &nvml.GpuInstancePlacement{Start: 1, Size: 1})
			return ret
		},
		CallGetGpuInstances:                    func(f *migFixture) nvml.Return { _, ret := f.d.GetGpuInstances(&f.info1g); return ret },
		CallGetGpuInstanceByID:                 func(f *migFixture) nvml.Return { _, ret := f.d.GetGpuInstanceById(2); return ret },
		CallGetMaxMigDeviceCount:               func(f *migFixture) nvml.Return { _, ret := f.d.GetMaxMigDeviceCount(); return ret },
		CallGetMigDeviceHandleByIndex:          func(f *migFixture) nvml.Return { _, ret := f.d.GetMigDeviceHandleByIndex(0); return ret },
		CallIsMigDeviceHandle:                  func(f *migFixture) nvml.Return { _, ret := f.md.IsMigDeviceHandle(); return ret },
		CallGetDeviceHandleFromMigDeviceHandle: func(f *migFixture) nvml.Return { _, ret := f.md.GetDeviceHandleFromMigDeviceHandle(); return ret },
		CallGpuInstanceGetInfo:                 func(f *migFixture) nvml.Return { _, ret := f.gi.GetInfo(); return ret },
		CallGetComputeInstanceProfileInfo: func(f *migFixture) nvml.Return {
			_, ret := f.gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
			return ret
		},
		CallCreateComputeInstance:  func(f *migFixture) nvml.Return { _, ret := f.empty.CreateComputeInstance(&f.ciInfo); return ret },
		CallGetComputeInstances:    func(f *migFixture) nvml.Return { _, ret := f.empty.GetComputeInstances(&f.ciInfo); return ret },
		CallGetComputeInstanceByID: func(f *migFixture) nvml.Return { _, ret := f.gi.GetComputeInstanceById(0); return ret },
		CallGpuInstanceDestroy:     func(f *migFixture) nvml.Return { return f.empty.Destroy() },
		CallComputeInstanceGetInfo: func(f *migFixture) nvml.Return { _, ret := f.ci.GetInfo(); return ret },
		CallComputeInstanceDestroy: func(f *migFixture) nvml.Return { return f.ci.Destroy() },
		CallMigDeviceGetUUID:       func(f *migFixture) nvml.Return { _, ret := f.md.GetUUID(); return ret },
	}
	for _, call := range MIGCalls() {
		t.Run(string(call), func(t *testing.T) {
			do, ok := calls[call]
			if !ok {
				t.Fatalf("no test for %s", call)
			}
			f := newMIGFixture(t)
			before := layout(f.n, 0)
			if err := f.n.FailCall(CallFault{Call: call, Nth: 1, Ret: nvml.ERROR_UNKNOWN}); err != nil {
				t.Fatal(err)
			}
			if ret := do(f); ret != nvml.ERROR_UNKNOWN {
				t.Fatalf("first call: %v, want the injected ERROR_UNKNOWN", ret)
			}
			if after := layout(f.n, 0); after != before {
				t.Fatalf("the failed call changed the GPU:\n%s\nwas:\n%s", after, before)
			}
			if ret := do(f); ret == nvml.ERROR_UNKNOWN {
				t.Fatalf("second call: %v, want the call's own answer", ret)
			}
		})
	}
	if len(calls) != len(MIGCalls()) {
		t.Errorf("%d calls tested, %d MIG calls", len(calls), len(MIGCalls()))
	}
}

// TestMIGFailureBetweenAnyTwoCalls runs the calls that make a MIG
// device, failing each in turn as a crash between two calls would stop
// them: the GPU holds what the calls before made, and a GPU instance
// whose compute instance failed can be destroyed.
func TestMIGFailureBetweenAnyTwoCalls(t *testing.T) {
	// run makes a 2g.20gb at {2}:2 and its MIG device, stopping at the
	// first failed call; it returns the layouts after each call and the
	// failed call's answer.
	run := func(t *testing.T, n *Node, d nvml.Device) ([]string, nvml.Return) {
		var layouts []string
		var gi nvml.GpuInstance
		var ciInfo nvml.ComputeInstanceProfileInfo
		var giInfo nvml.GpuInstanceProfileInfo
		var md nvml.Device
		steps := []func() nvml.Return{
			func() nvml.Return { _, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); return ret },
			func() (ret nvml.Return) {
				giInfo, ret = d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
				return ret
			},
			func() (ret nvml.Return) {
				gi, ret = d.CreateGpuInstanceWithPlacement(&giInfo, &nvml.GpuInstancePlacement{Start: 2, Size: 2})
				return ret
			},
			func() (ret nvml.Return) {
				ciInfo, ret = gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 0)
				return ret
			},
			func() nvml.Return { _, ret := gi.CreateComputeInstance(&ciInfo); return ret },
			func() (ret nvml.Return) { md, ret = d.GetMigDeviceHandleByIndex(0); return ret },
			func() nvml.Return { _, ret := md.GetUUID(); return ret },
		}
		for _, step := range steps {
			if ret := step(); ret != nvml.SUCCESS {
				if len(layouts) == 4 {
					// CreateComputeInstance failed: roll back its GPU
					// instance.
					if ret := gi.Destroy(); ret != nvml.SUCCESS {
						t.Errorf("destroy the GPU instance left without a compute instance: %v", ret)
					}
				}
				return layouts, ret
			}
			layouts = append(layouts, layout(n, 0))
		}
		return layouts, nvml.SUCCESS
	}

	n, d, _ := gpu0(t, "dgx-h100")
	clean, ret := run(t, n, d)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	total := n.CallCount(CallAnyMIG)
	want := []string{
		"mode 1/1",
		"mode 1/1",
		"mode 1/1; GI 4 2g.20gb@{2}:2",
		"mode 1/1; GI 4 2g.20gb@{2}:2",
		"mode 1/1; GI 4 2g.20gb@{2}:2 CI 0 2c@0",
		"mode 1/1; GI 4 2g.20gb@{2}:2 CI 0 2c@0",
		"mode 1/1; GI 4 2g.20gb@{2}:2 CI 0 2c@0",
	}
	if total != len(want) || strings.Join(clean, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%d calls:\n%s\nwant %d:\n%s", total, strings.Join(clean, "\n"), len(want), strings.Join(want, "\n"))
	}
	for k := 1; k <= total; k++ {
		n, d, _ := gpu0(t, "dgx-h100")
		if err := n.FailCall(CallFault{Call: CallAnyMIG, Nth: k, Ret: nvml.ERROR_UNKNOWN}); err != nil {
			t.Fatal(err)
		}
		layouts, ret := run(t, n, d)
		if ret != nvml.ERROR_UNKNOWN || len(layouts) != k-1 {
			t.Errorf("failing call %d: stopped after %d calls with %v, want after %d with ERROR_UNKNOWN", k, len(layouts), ret, k-1)
			continue
		}
		got := layout(n, 0)
		wantNow := "mode 0/0"
		if k > 1 {
			wantNow = want[k-2]
		}
		if k == 5 {
			// The GPU instance was rolled back.
			wantNow = "mode 1/1"
		}
		if got != wantNow {
			t.Errorf("failing call %d: the GPU holds %s, want %s", k, got, wantNow)
		}
	}
}
