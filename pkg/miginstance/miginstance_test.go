package miginstance

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// fixture is a simulated node whose GPU 0 may hold a partition an
// administrator made (foreign), and a manager over a journal directory.
type fixture struct {
	t     *testing.T
	sim   *simnode.Node
	dev   nvml.Device
	model mig.Model
	dir   string
	arch  string
	// boot is the node's boot ID the managers are given; a test's reboot
	// changes it.
	boot string
}

func newFixture(t *testing.T, preset string) *fixture {
	t.Helper()
	n, err := simnode.Load(preset, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	d, ret := n.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	m := simnodetest.MIGModel(t, d)
	arch := "hopper"
	if strings.Contains(preset, "a100") {
		arch = "ampere"
	}
	return &fixture{t: t, sim: n, dev: d, model: m, dir: t.TempDir(), arch: arch, boot: "boot-1"}
}

func (f *fixture) manager(step func(string) bool) *Manager {
	f.t.Helper()
	m, err := New(Options{Dir: f.dir, NVML: f.sim.NVML(), Minors: func() ([]byte, error) { return f.sim.MIGMinorsFile(), nil }, BootID: f.boot, Step: step})
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

func (f *fixture) profile(name string) mig.Profile {
	f.t.Helper()
	p, err := f.model.Profile(name)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) want(claim, profile string, start int) Want {
	p := f.profile(profile)
	return Want{
		Claim: types.UID(claim), Device: fmt.Sprintf("g0-mig-%s-%d", strings.ReplaceAll(profile, ".", "-"), start),
		GPU: 0, GPUMinor: 0, GPUUUID: "GPU-0", Architecture: f.arch, Profile: p, Placement: mig.Placement{Start: start, Size: p.MemorySlices},
	}
}

// enable turns MIG mode on as an administrator would.
func (f *fixture) enable() {
	f.t.Helper()
	if act, ret := f.dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS {
		f.t.Fatalf("SetMigMode: %v %v", act, ret)
	}
}

// foreign makes, as an administrator would, a 1g.10gb instance with its
// compute instance at slice 0 and one without at slice 1.
func (f *fixture) foreign() {
	f.t.Helper()
	p := f.profile(f.model.Profiles[0].Name)
	info, ret := f.dev.GetGpuInstanceProfileInfo(p.Index)
	if ret != nvml.SUCCESS {
		f.t.Fatal(ret)
	}
	for _, start := range []int{0, 1} {
		gi, ret := f.dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: 1})
		if ret != nvml.SUCCESS {
			f.t.Fatal(ret)
		}
		if start == 1 {
			continue
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			f.t.Fatal(ret)
		}
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			f.t.Fatal(ret)
		}
	}
}

// retry repeats an NVML call a fault armed for the code under test made
// fail (each fault fires once), so that the test's own reads see the node.
func retry[T any](call func() (T, nvml.Return)) (T, nvml.Return) {
	v, ret := call()
	for i := 0; i < 8 && ret == nvml.ERROR_UNKNOWN; i++ {
		v, ret = call()
	}
	return v, ret
}

// layout lists GPU 0's GPU instances through NVML as "profileID@{start}:size/CIs",
// sorted.
func (f *fixture) layout() []string {
	f.t.Helper()
	var out []string
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := retry(func() (nvml.GpuInstanceProfileInfo, nvml.Return) { return f.dev.GetGpuInstanceProfileInfo(index) })
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := retry(func() ([]nvml.GpuInstance, nvml.Return) { return f.dev.GetGpuInstances(&info) })
		if ret == nvml.ERROR_NOT_SUPPORTED {
			return nil
		}
		if ret != nvml.SUCCESS {
			f.t.Fatalf("GetGpuInstances: %v", ret)
		}
		for _, gi := range gis {
			gInfo, _ := retry(gi.GetInfo)
			n := 0
			for ci := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
				ciInfo, ret := retry(func() (nvml.ComputeInstanceProfileInfo, nvml.Return) {
					return gi.GetComputeInstanceProfileInfo(ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				})
				if ret != nvml.SUCCESS {
					continue
				}
				cis, _ := retry(func() ([]nvml.ComputeInstance, nvml.Return) { return gi.GetComputeInstances(&ciInfo) })
				n += len(cis)
			}
			out = append(out, fmt.Sprintf("%d@{%d}:%d/%d", gInfo.ProfileId, gInfo.Placement.Start, gInfo.Placement.Size, n))
		}
	}
	slices.Sort(out)
	return out
}

func (f *fixture) records() []Record {
	f.t.Helper()
	r, res, err := newJournal(f.dir).load()
	if err != nil || res.RecoveredFrom != nil {
		f.t.Fatalf("read the journal: %v (recovered from %v)", err, res.RecoveredFrom)
	}
	return r
}

func TestEnsureMakesTheInstanceAndDestroyUnmakesIt(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	m := f.manager(nil)
	w := f.want("claim-a", "1g.10gb", 6)
	inst, err := m.Ensure(ctx, w)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if got, want := f.layout(), []string{"19@{6}:1/1"}; !slices.Equal(got, want) {
		t.Errorf("layout = %v, want %v", got, want)
	}
	nodes, err := f.sim.MIGDeviceNodes(inst.UUID)
	if err != nil {
		t.Fatalf("the instance's UUID %q is no MIG device of the node: %v", inst.UUID, err)
	}
	if got, want := inst.CapabilityNodes, []string{nodes[4].Path, nodes[5].Path}; !slices.Equal(got, want) {
		t.Errorf("capability nodes = %v, want %v", got, want)
	}
	again, err := m.Ensure(ctx, w)
	if err != nil || again.UUID != inst.UUID {
		t.Errorf("a repeated Ensure = %+v, %v; want the same instance %s", again, err, inst.UUID)
	}
	if got, ok, err := m.Lookup(w.Claim, w.Device); !ok || err != nil || got.UUID != inst.UUID {
		t.Errorf("Lookup = %+v, %v, %v", got, ok, err)
	}
	for i := range 2 {
		if err := m.Destroy(ctx, w.Claim); err != nil {
			t.Fatalf("Destroy #%d: %v", i+1, err)
		}
		if got := f.layout(); len(got) != 0 {
			t.Errorf("after Destroy #%d: layout %v, want none", i+1, got)
		}
		if got := f.records(); len(got) != 0 {
			t.Errorf("after Destroy #%d: records %v, want none", i+1, got)
		}
	}
}

func TestEnsureOnAmpereWithMIGOffAsksForAReset(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-a100")
	_, err := f.manager(nil).Ensure(ctx, f.want("claim-a", "1g.5gb", 6))
	if err == nil || !strings.Contains(err.Error(), "nvidia-smi -i 0 -mig 1") || !strings.Contains(err.Error(), "--gpu-reset") {
		t.Fatalf("Ensure = %v; want an error saying to turn MIG on and reset the GPU", err)
	}
	if n := f.sim.CallCount(simnode.CallSetMigMode); n != 0 {
		t.Errorf("SetMigMode called %d times on an Ampere GPU; want never", n)
	}
	if len(f.records()) != 0 {
		t.Errorf("records %v, want none", f.records())
	}
}

func TestEnsureOverlappingPlacementNamesInsufficientResources(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	m := f.manager(nil)
	if _, err := m.Ensure(ctx, f.want("claim-a", "3g.40gb", 4)); err != nil {
		t.Fatal(err)
	}
	_, err := m.Ensure(ctx, f.want("claim-b", "1g.10gb", 6))
	if !IsReturn(err, nvml.ERROR_INSUFFICIENT_RESOURCES) || !strings.Contains(err.Error(), "ERROR_INSUFFICIENT_RESOURCES") {
		t.Fatalf("Ensure of an overlapping placement = %v; want ERROR_INSUFFICIENT_RESOURCES named", err)
	}
	if got, want := f.layout(), []string{"9@{4}:4/1"}; !slices.Equal(got, want) {
		t.Errorf("layout = %v, want %v", got, want)
	}
	if got := f.records(); len(got) != 1 || got[0].Claim != "claim-a" {
		t.Errorf("records = %v, want claim-a's alone", got)
	}
}

// TestForeignInstanceAtThePlacementIsRefusedAndLeft: an instance an
// administrator made where the claim's would go is not taken for a
// half-made one, neither by Ensure nor by Reconcile.
func TestForeignInstanceAtThePlacementIsRefusedAndLeft(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	f.foreign()
	m := f.manager(nil)
	before := f.layout()
	_, err := m.Ensure(ctx, f.want("claim-a", "1g.10gb", 1))
	if !IsReturn(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Fatalf("Ensure at a foreign instance's placement = %v; want ERROR_INSUFFICIENT_RESOURCES", err)
	}
	if err := m.Reconcile(ctx, func() (map[types.UID]bool, bool) { return nil, true }); err != nil {
		t.Fatal(err)
	}
	if got := f.layout(); !slices.Equal(got, before) {
		t.Errorf("layout = %v, want the foreign instances %v untouched", got, before)
	}
}

func TestJournalSurvivesANewManager(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	inst, err := f.manager(nil).Ensure(ctx, f.want("claim-a", "2g.20gb", 4))
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := f.manager(nil).Lookup("claim-a", "g0-mig-2g-20gb-4")
	if err != nil || !ok || got.UUID != inst.UUID {
		t.Fatalf("Lookup after a restart = %+v, %v, %v; want %s", got, ok, err, inst.UUID)
	}
	raw, err := os.ReadFile(filepath.Join(f.dir, JournalFile))
	if err != nil || !strings.Contains(string(raw), `"phase":"Created"`) {
		t.Errorf("journal = %s, %v", raw, err)
	}
}

// TestReconcileBesideEnsures runs reconciles while instances are made and
// looked up: every claim holds its seat (as the ledger records it before
// the instance is made), so every instance is made once and stays.
func TestReconcileBesideEnsures(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	m := f.manager(nil)
	starts := []int{6, 5, 4, 3, 2, 1, 0}
	all := map[types.UID]bool{}
	for _, s := range starts {
		all[types.UID(fmt.Sprintf("claim-%d", s))] = true
	}
	prepared := func() (map[types.UID]bool, bool) { return all, true }
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(starts))
	for _, s := range starts {
		w := f.want(fmt.Sprintf("claim-%d", s), "1g.10gb", s)
		wg.Go(func() {
			if _, err := m.Ensure(ctx, w); err != nil {
				errs <- err
			}
			if _, ok, err := m.Lookup(w.Claim, w.Device); !ok || err != nil {
				errs <- fmt.Errorf("Lookup %s: %v %v", w.Claim, ok, err)
			}
		})
		wg.Go(func() {
			if err := m.Reconcile(ctx, prepared); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := f.layout(); len(got) != len(starts) {
		t.Errorf("layout = %v, want %d instances", got, len(starts))
	}
	if got := f.records(); len(got) != len(starts) {
		t.Errorf("records = %v, want %d", got, len(starts))
	}
}
