package miginstance

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"
)

// The plugin's 2g.20gb instance for claim-a goes at memory slices 4–5 of
// GPU 0: GPU instance 5 there (IDs follow placement).
const (
	crashedGI     = 5
	crashedLayout = "14@{4}:2/" // + its compute instances
)

// reboot resets GPU 0 as a reboot does (every instance gone, MIG mode
// kept) and gives the managers made after it the next boot's ID.
func (f *fixture) reboot() {
	f.t.Helper()
	if err := f.sim.ResetGPU(0); err != nil {
		f.t.Fatal(err)
	}
	f.boot = "boot-2"
}

// partition makes, as an administrator would, a 2g.20gb GPU instance at
// slices 4–5 holding compute instances of the given sizes in compute
// slices (2: one that spans it), and returns the GPU instance's ID.
func (f *fixture) partition(ciSlices ...int) int {
	f.t.Helper()
	info, ret := f.dev.GetGpuInstanceProfileInfo(f.profile("2g.20gb").Index)
	if ret != nvml.SUCCESS {
		f.t.Fatal(ret)
	}
	gi, ret := f.dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 4, Size: 2})
	if ret != nvml.SUCCESS {
		f.t.Fatalf("CreateGpuInstanceWithPlacement: %v", ret)
	}
	f.computeInstances(gi, ciSlices...)
	gInfo, _ := gi.GetInfo()
	return int(gInfo.Id)
}

// computeInstances makes, as an administrator would, compute instances of
// the given sizes in gi.
func (f *fixture) computeInstances(gi nvml.GpuInstance, ciSlices ...int) {
	f.t.Helper()
	for _, s := range ciSlices {
		index := map[int]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE}[s]
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			f.t.Fatal(ret)
		}
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			f.t.Fatalf("CreateComputeInstance: %v", ret)
		}
	}
}

// destroyGI destroys, as an administrator would, the GPU instance at
// slices 4–5 and what it holds.
func (f *fixture) destroyGI() {
	f.t.Helper()
	gi, ret := f.dev.GetGpuInstanceById(crashedGI)
	if ret != nvml.SUCCESS {
		f.t.Fatalf("GetGpuInstanceById: %v", ret)
	}
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, _ := gi.GetComputeInstances(&ciInfo)
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				f.t.Fatal(ret)
			}
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		f.t.Fatal(ret)
	}
}

// halfMade crashes claim-a's prepare of a 2g.20gb instance at slices 4–5
// at step, beside the fixture's foreign instances.
func (f *fixture) halfMade(step string) {
	f.t.Helper()
	_, ctx := ktesting.NewTestContext(f.t)
	f.enable()
	f.foreign()
	if _, err := f.manager(stepNamed(step).step).Ensure(ctx, f.want("claim-a", "2g.20gb", 4)); !errors.Is(err, errCrashed) {
		f.t.Fatalf("Ensure: %v, want the crash at %s", err, step)
	}
	if r := f.records(); len(r) != 1 || r[0].Phase.Made() {
		f.t.Fatalf("records after the crash at %s: %v, want claim-a's half made", step, r)
	}
}

// TestARebootForgetsHalfMadeRecords: the journal records a half-made
// instance, the node reboots, and an administrator's partition made at
// boot sits at that placement, under the same GPU-instance ID. The next
// start's reconcile (the claim held, or released) and the claim's retried
// prepare leave the partition and its compute instance as they are: the
// record is of an earlier boot, and what it made did not outlive it.
func TestARebootForgetsHalfMadeRecords(t *testing.T) {
	for _, step := range []string{
		"CreateGpuInstanceWithPlacement", // GIIntended, nothing made
		"GpuInstance.GetInfo",            // GIIntended, the GPU instance made
		"GetComputeInstanceProfileInfo",  // GIMade
		"CreateComputeInstance",          // CIIntended, no compute instance
		"record created",                 // CIIntended, the compute instance made
	} {
		for _, released := range []bool{false, true} {
			t.Run(claimState(step, released), func(t *testing.T) {
				_, ctx := ktesting.NewTestContext(t)
				f := newFixture(t, "dgx-h100")
				f.halfMade(step)
				f.reboot()
				f.foreign()
				if gi := f.partition(2); gi != crashedGI {
					t.Fatalf("the administrator's partition is GPU instance %d, want %d (IDs follow placement)", gi, crashedGI)
				}
				partitioned := f.layout()
				m := f.manager(nil)
				claims := held("claim-a")
				if released {
					claims = held()
				}
				if err := m.Reconcile(ctx, claims); err != nil {
					t.Fatalf("Reconcile: %v", err)
				}
				if got := f.layout(); !slices.Equal(got, partitioned) {
					t.Fatalf("after the start's reconcile the GPU holds %v, want the administrator's %v", got, partitioned)
				}
				if r := f.records(); len(r) != 0 {
					t.Errorf("records = %v, want the earlier boot's forgotten", r)
				}
				if !released {
					if _, err := m.Ensure(ctx, f.want("claim-a", "2g.20gb", 4)); !IsReturn(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
						t.Errorf("the retried prepare = %v, want a refusal naming the partition in the way", err)
					}
				}
				if err := m.Destroy(ctx, "claim-a"); err != nil {
					t.Fatalf("Destroy: %v", err)
				}
				if got := f.layout(); !slices.Equal(got, partitioned) {
					t.Errorf("after the claim's unprepare the GPU holds %v, want the administrator's %v", got, partitioned)
				}
			})
		}
	}
}

// TestARebootForgetsMadeInstances: an instance made and recorded in an
// earlier boot is forgotten, not destroyed: the partition at its
// placement now is an administrator's; the claim's prepare, retried after
// the reboot, is refused rather than take it.
func TestARebootForgetsMadeInstances(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	if _, err := f.manager(nil).Ensure(ctx, f.want("claim-a", "2g.20gb", 4)); err != nil {
		t.Fatal(err)
	}
	f.reboot()
	f.partition(2)
	partitioned := f.layout()
	m := f.manager(nil)
	if _, ok, err := m.Lookup("claim-a", "g0-mig-2g-20gb-4"); ok || err != nil {
		t.Errorf("Lookup of an earlier boot's instance = %v, %v; want none", ok, err)
	}
	if err := m.Reconcile(ctx, held()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Ensure(ctx, f.want("claim-a", "2g.20gb", 4)); !IsReturn(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Errorf("the retried prepare = %v, want a refusal", err)
	}
	if got := f.layout(); !slices.Equal(got, partitioned) {
		t.Errorf("the GPU holds %v, want the administrator's %v", got, partitioned)
	}
	if r := f.records(); len(r) != 0 {
		t.Errorf("records = %v, want none", r)
	}
}

// TestAHalfMadeRecordLeavesWhatItsStepCannotHaveMade crashes a prepare at
// each step that leaves a half-made record, and has an administrator
// change the GPU at its placement before the plugin starts again, within
// the same boot. Only what the interrupted step can itself have left is
// destroyed (journal.go); an instance holding a compute instance the step
// cannot have made is left, and the record is forgotten either way.
func TestAHalfMadeRecordLeavesWhatItsStepCannotHaveMade(t *testing.T) {
	tests := []struct {
		name string
		step string
		// admin changes GPU 0 during the restart.
		admin func(f *fixture)
		// left is what the restart leaves at slices 4–5 ("" nothing).
		left string
	}{
		{
			name: "GIMade: the GPU instance replaced by a partition with its compute instance",
			step: "GetComputeInstanceProfileInfo",
			admin: func(f *fixture) {
				f.destroyGI()
				f.partition(2)
			},
			left: crashedLayout + "1",
		},
		{
			name: "GIMade: compute instances made in the plugin's GPU instance",
			step: "GetComputeInstanceProfileInfo",
			admin: func(f *fixture) {
				gi, _ := f.dev.GetGpuInstanceById(crashedGI)
				f.computeInstances(gi, 1, 1)
			},
			left: crashedLayout + "2",
		},
		{
			name: "CIIntended: compute instances that do not span it made in the plugin's GPU instance",
			step: "CreateComputeInstance",
			admin: func(f *fixture) {
				gi, _ := f.dev.GetGpuInstanceById(crashedGI)
				f.computeInstances(gi, 1)
			},
			left: crashedLayout + "1",
		},
		{
			name: "CIIntended: another compute instance beside the plugin's",
			step: "record created",
			admin: func(f *fixture) {
				// The plugin's spans the GPU instance: replaced by two.
				f.destroyGI()
				f.partition(1, 1)
			},
			left: crashedLayout + "2",
		},
		{
			name:  "GIIntended: the plugin's bare GPU instance, untouched",
			step:  "GpuInstance.GetInfo",
			admin: func(*fixture) {},
		},
		{
			name:  "GIMade: the plugin's bare GPU instance, untouched",
			step:  "GetComputeInstanceProfileInfo",
			admin: func(*fixture) {},
		},
		{
			name:  "CIIntended: the plugin's whole instance, untouched",
			step:  "record created",
			admin: func(*fixture) {},
		},
	}
	for _, tt := range tests {
		for _, released := range []bool{false, true} {
			t.Run(claimState(tt.name, released), func(t *testing.T) {
				_, ctx := ktesting.NewTestContext(t)
				f := newFixture(t, "dgx-h100")
				f.halfMade(tt.step)
				foreign := f.layout()
				foreign = slices.DeleteFunc(foreign, func(s string) bool { return strings.HasPrefix(s, crashedLayout) })
				tt.admin(f)
				want := slices.Clone(foreign)
				if tt.left != "" {
					want = append(want, tt.left)
					slices.Sort(want)
				}
				m := f.manager(nil)
				claims := held("claim-a")
				if released {
					claims = held()
				}
				if err := m.Reconcile(ctx, claims); err != nil {
					t.Fatalf("Reconcile: %v", err)
				}
				if got := f.layout(); !slices.Equal(got, want) {
					t.Fatalf("after the restart's reconcile the GPU holds %v, want %v", got, want)
				}
				if r := f.records(); len(r) != 0 {
					t.Fatalf("records = %v, want the half-made one forgotten", r)
				}
				if released {
					return
				}
				_, err := m.Ensure(ctx, f.want("claim-a", "2g.20gb", 4))
				if tt.left == "" && err != nil {
					t.Fatalf("the retried prepare: %v", err)
				}
				if tt.left != "" && !IsReturn(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
					t.Fatalf("the retried prepare = %v, want a refusal naming the instance in the way", err)
				}
			})
		}
	}
}

// claimState names a subtest run with the claim held or released.
func claimState(name string, released bool) string {
	if released {
		return name + ", claim released"
	}
	return name + ", claim held"
}
