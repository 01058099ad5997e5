package miginstance

import (
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// destroyOutside destroys, as an administrator's nvidia-smi would, the
// compute instances of the GPU instance at start and, unless ciOnly, the
// GPU instance itself.
func (f *fixture) destroyOutside(profile string, start int, ciOnly bool) {
	f.t.Helper()
	p := f.profile(profile)
	info, ret := f.dev.GetGpuInstanceProfileInfo(p.Index)
	if ret != nvml.SUCCESS {
		f.t.Fatal(ret)
	}
	gi, _, found, err := instanceAt(f.dev, &info, mig.Placement{Start: start, Size: p.MemorySlices})
	if err != nil || !found {
		f.t.Fatalf("no %s instance at %d: %v", profile, start, err)
	}
	cis, err := computeInstances(gi)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, ci := range cis {
		c, ret := gi.GetComputeInstanceById(int(ci.Id))
		if ret != nvml.SUCCESS {
			f.t.Fatal(ret)
		}
		if ret := c.Destroy(); ret != nvml.SUCCESS {
			f.t.Fatal(ret)
		}
	}
	if ciOnly {
		return
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		f.t.Fatal(ret)
	}
}

func TestGoneListsTheInstancesDestroyedOutsideThePlugin(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	m := f.manager(nil)
	whole, noCI, remade, kept := f.want("claim-a", "1g.10gb", 6), f.want("claim-b", "1g.10gb", 5), f.want("claim-c", "2g.20gb", 0), f.want("claim-d", "1g.10gb", 3)
	for _, w := range []Want{whole, noCI, remade, kept} {
		if _, err := m.Ensure(ctx, w); err != nil {
			t.Fatalf("Ensure %s: %v", w.Device, err)
		}
	}
	if gone, err := m.Gone(ctx); err != nil || len(gone) != 0 {
		t.Fatalf("Gone with every instance whole = %v, %v; want none", gone, err)
	}
	f.destroyOutside("1g.10gb", 6, false)
	f.destroyOutside("1g.10gb", 5, true)
	// Someone destroys claim-c's 2g and makes their own at its placement:
	// the same GPU instance ID, another MIG device.
	f.destroyOutside("2g.20gb", 0, false)
	info, _ := f.dev.GetGpuInstanceProfileInfo(remade.Profile.Index)
	gi, ret := f.dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 2})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}

	claims := func(rs []Record) []types.UID {
		var out []types.UID
		for _, r := range rs {
			out = append(out, r.Claim)
		}
		slices.Sort(out)
		return out
	}
	gone, err := m.Gone(ctx)
	if got, want := claims(gone), []types.UID{"claim-a", "claim-b", "claim-c"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("Gone = %v, %v; want the records of %v", got, err, want)
	}
	if gone, err := m.Gone(ctx, "claim-b", "claim-d"); err != nil || !slices.Equal(claims(gone), []types.UID{"claim-b"}) {
		t.Errorf("Gone(claim-b, claim-d) = %v, %v; want claim-b's", claims(gone), err)
	}
	if got := f.records(); len(got) != 4 {
		t.Errorf("Gone changed the journal: %d records, want 4", len(got))
	}
	// The claim's next prepare makes it again; its unprepare forgets it.
	if _, err := m.Ensure(ctx, whole); err != nil {
		t.Fatalf("Ensure again: %v", err)
	}
	if err := m.Destroy(ctx, noCI.Claim); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if gone, err := m.Gone(ctx); err != nil || !slices.Equal(claims(gone), []types.UID{"claim-c"}) {
		t.Errorf("after the prepare and the unprepare: Gone = %v, %v; want claim-c's", claims(gone), err)
	}
}
