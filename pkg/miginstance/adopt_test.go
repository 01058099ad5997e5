package miginstance

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// staticUUID is the MIG device UUID of the administrator's 1g.10gb
// instance at slice 0 (fixture.foreign), read through NVML: the GPU's only
// MIG device.
func (f *fixture) staticUUID() string {
	f.t.Helper()
	md, ret := f.dev.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		f.t.Fatalf("GetMigDeviceHandleByIndex(0): %v", ret)
	}
	uuid, ret := md.GetUUID()
	if ret != nvml.SUCCESS {
		f.t.Fatalf("GetUUID: %v", ret)
	}
	return uuid
}

// oldReaderRecords are the journal's records as a reader that knows no
// adopted instances reads them (a plugin rolled back to): it reads
// "records" of a v1 file, and refuses any other version, reading none.
func (f *fixture) oldReaderRecords() []Record {
	f.t.Helper()
	raw, err := os.ReadFile(filepath.Join(f.dir, JournalFile))
	if err != nil {
		f.t.Fatal(err)
	}
	var v struct {
		Version string
		Records []Record
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		f.t.Fatal(err)
	}
	if v.Version != "v1" {
		return nil
	}
	return v.Records
}

func TestPartitionsListWhatThePluginDidNotMake(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	f.foreign()
	m := f.manager(nil)
	if _, err := m.Ensure(ctx, f.want("claim-m", "2g.20gb", 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Ensure(ctx, f.adopt("claim-a", 0)); err != nil {
		t.Fatal(err)
	}
	got, err := m.Partitions(ctx, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	want := []Partition{
		{GPU: 0, GI: 7, ProfileID: 19, Placement: mig.Placement{Start: 0, Size: 1}, ComputeInstances: 1, Whole: true, Claim: "claim-a"},
		{GPU: 0, GI: 8, ProfileID: 19, Placement: mig.Placement{Start: 1, Size: 1}},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Partitions = %+v, want %+v (the made 2g.20gb instance is not one)", got, want)
	}
}

// adopt is the Want of a claim on the static seat 1g.10gb at start.
func (f *fixture) adopt(claim string, start int) Want {
	w := f.want(claim, "1g.10gb", start)
	w.Adopt = true
	return w
}

func TestAdoptedInstanceIsUsedAndNeverDestroyed(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	f.foreign()
	layout := f.layout()
	uuid := f.staticUUID()
	m := f.manager(nil)
	w := f.adopt("claim-a", 0)
	inst, err := m.Ensure(ctx, w)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if inst.UUID != uuid || len(inst.CapabilityNodes) != 2 {
		t.Errorf("Ensure = %+v, want the static instance %s with its two capability nodes", inst, uuid)
	}
	if got := f.layout(); !slices.Equal(got, layout) {
		t.Errorf("layout = %v, want %v unchanged", got, layout)
	}
	if r := f.records(); len(r) != 1 || r[0].Phase != Adopted || r[0].UUID != uuid {
		t.Errorf("records = %v, want one Adopted of %s", r, uuid)
	}
	if r := f.oldReaderRecords(); len(r) != 0 {
		t.Errorf("a reader that knows no adopted instances reads %v, want no record: it would destroy an instance it took for its own", r)
	}
	if got, ok, err := m.Lookup(w.Claim, w.Device); !ok || err != nil || got.UUID != uuid {
		t.Errorf("Lookup = %+v, %v, %v", got, ok, err)
	}
	if again, err := m.Ensure(ctx, w); err != nil || again.UUID != uuid {
		t.Errorf("a repeated Ensure = %+v, %v", again, err)
	}
	// Another claim on the same static seat (a stale allocation) is refused.
	if _, err := m.Ensure(ctx, f.adopt("claim-b", 0)); !IsReturn(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Errorf("a second claim's adoption = %v, want ERROR_INSUFFICIENT_RESOURCES", err)
	}
	if err := m.Reconcile(ctx, held("claim-a")); err != nil {
		t.Fatal(err)
	}
	if r := f.records(); len(r) != 1 {
		t.Errorf("after a reconcile with the claim held: records = %v, want it kept", r)
	}
	for i := range 2 {
		if err := m.Destroy(ctx, w.Claim); err != nil {
			t.Fatalf("Destroy #%d: %v", i+1, err)
		}
		if got := f.layout(); !slices.Equal(got, layout) {
			t.Errorf("after Destroy #%d: layout = %v, want %v", i+1, got, layout)
		}
		if r := f.records(); len(r) != 0 {
			t.Errorf("after Destroy #%d: records = %v, want none", i+1, r)
		}
	}
}

func TestAdoptRefusesAnInstanceThatIsNoSeat(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	f.foreign()
	layout := f.layout()
	_, err := f.manager(nil).Ensure(ctx, f.adopt("claim-a", 1))
	if err == nil || !strings.Contains(err.Error(), "holds 0 compute instances") {
		t.Errorf("adopting the instance without a compute instance = %v, want a refusal saying why", err)
	}
	if got := f.layout(); !slices.Equal(got, layout) {
		t.Errorf("layout = %v, want %v unchanged", got, layout)
	}
	if r := f.records(); len(r) != 0 {
		t.Errorf("records = %v, want none", r)
	}
}

// TestAdoptWhereTheStaticInstanceIsGoneMakesOne: a static seat whose
// instance an administrator removed after the start gets an instance made
// as any seat's, which its unprepare destroys.
func TestAdoptWhereTheStaticInstanceIsGoneMakesOne(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	m := f.manager(nil)
	w := f.adopt("claim-a", 6)
	if _, err := m.Ensure(ctx, w); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if r := f.records(); len(r) != 1 || r[0].Phase != Created {
		t.Errorf("records = %v, want one Created", r)
	}
	if err := m.Destroy(ctx, w.Claim); err != nil {
		t.Fatal(err)
	}
	if got := f.layout(); len(got) != 0 {
		t.Errorf("layout = %v, want none", got)
	}
}

// TestCrashBetweenAnyTwoStepsOfAdoption stops an adoption at each of its
// steps, restarts (a new manager, Reconcile) and retries it with the claim
// still held, or finds the claim released; then it does the same for the
// release (Destroy). Nothing is ever destroyed, and the retried adoption
// answers the static instance.
func TestCrashBetweenAnyTwoStepsOfAdoption(t *testing.T) {
	steps := 0
	for _, released := range []bool{false, true} {
		for k := 1; ; k++ {
			_, ctx := ktesting.NewTestContext(t)
			f := newFixture(t, "dgx-h100")
			f.enable()
			f.foreign()
			layout, uuid := f.layout(), f.staticUUID()
			w := f.adopt("claim-a", 0)
			c := &crashAt{k: k}
			_, err := f.manager(c.step).Ensure(ctx, w)
			if c.n < k {
				if err != nil {
					t.Fatalf("Ensure with no crash: %v", err)
				}
				steps = k - 1
				break
			}
			if !errors.Is(err, errCrashed) {
				t.Fatalf("step %d: Ensure = %v, want the crash", k, err)
			}
			m := f.manager(nil)
			if released {
				if err := m.Reconcile(ctx, held()); err != nil {
					t.Fatalf("step %d: Reconcile: %v", k, err)
				}
				if r := f.records(); len(r) != 0 {
					t.Errorf("step %d, claim released: records = %v, want none", k, r)
				}
			} else {
				if err := m.Reconcile(ctx, held("claim-a")); err != nil {
					t.Fatalf("step %d: Reconcile: %v", k, err)
				}
				inst, err := m.Ensure(ctx, w)
				if err != nil || inst.UUID != uuid {
					t.Fatalf("step %d: the retried Ensure = %+v, %v; want the static instance %s", k, inst, err, uuid)
				}
			}
			if got := f.layout(); !slices.Equal(got, layout) {
				t.Fatalf("step %d: layout = %v, want %v", k, got, layout)
			}
		}
	}
	if steps != 3 {
		t.Errorf("an adoption took %d steps, want 3 (find, read UUID, record)", steps)
	}
	for k := 1; ; k++ {
		_, ctx := ktesting.NewTestContext(t)
		f := newFixture(t, "dgx-h100")
		f.enable()
		f.foreign()
		layout := f.layout()
		if _, err := f.manager(nil).Ensure(ctx, f.adopt("claim-a", 0)); err != nil {
			t.Fatal(err)
		}
		c := &crashAt{k: k}
		err := f.manager(c.step).Destroy(ctx, "claim-a")
		if c.n < k {
			if err != nil {
				t.Fatalf("Destroy with no crash: %v", err)
			}
			break
		}
		m := f.manager(nil)
		if err := m.Reconcile(ctx, held("claim-a")); err != nil {
			t.Fatalf("step %d of Destroy: Reconcile: %v", k, err)
		}
		if err := m.Destroy(ctx, "claim-a"); err != nil {
			t.Fatalf("step %d of Destroy: the retried Destroy: %v", k, err)
		}
		if got := f.layout(); !slices.Equal(got, layout) {
			t.Fatalf("step %d of Destroy: layout = %v, want %v", k, got, layout)
		}
		if r := f.records(); len(r) != 0 {
			t.Fatalf("step %d of Destroy: records = %v, want none", k, r)
		}
	}
}
