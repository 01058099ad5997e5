package miginstance

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// damages are the ways a journal file is found damaged.
var damages = map[string]func(raw []byte) []byte{
	"three bytes short": func(raw []byte) []byte { return raw[:len(raw)-3] },
	"a flipped bit": func(raw []byte) []byte {
		out := slices.Clone(raw)
		i := strings.Index(string(out), `"placementStart":4`) + len(`"placementStart":`)
		out[i] ^= 0x01 // 4 becomes 5
		return out
	},
	"empty":   func([]byte) []byte { return nil },
	"garbage": func([]byte) []byte { return []byte("\x89PNG\r\n\x1a\n{not a journal") },
}

// damage rewrites the journal file (which "prev" the previous copy) as
// change makes it.
func (f *fixture) damage(which string, change func([]byte) []byte) {
	f.t.Helper()
	path := filepath.Join(f.dir, JournalFile)
	if which == "prev" {
		path += ".prev"
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(path, change(raw), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// warnings records what a manager reports (Options.Warn).
type warnings struct {
	mu      sync.Mutex
	reasons []string
}

func (w *warnings) warn(_ context.Context, reason, _ string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reasons = append(w.reasons, reason)
}

func (w *warnings) got() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.reasons)
}

// recovering is a manager that reports to w and rebuilds from held.
func (f *fixture) recovering(w *warnings, held Held) *Manager {
	f.t.Helper()
	m, err := New(Options{Dir: f.dir, NVML: f.sim.NVML(), Minors: func() ([]byte, error) { return f.sim.MIGMinorsFile(), nil },
		BootID: f.boot, Held: held, Warn: w.warn})
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

// holding is a seat checkpoint's answer: the claims hold these devices.
func holding(wants ...Want) Held {
	return func() ([]Want, bool) { return wants, true }
}

// The operations a restarted plugin may call first; none of them fails
// for a damaged journal.
var firstCalls = map[string]func(ctx context.Context, f *fixture, m *Manager) error{
	"Reconcile": func(ctx context.Context, _ *fixture, m *Manager) error { return m.Reconcile(ctx, held("claim-a")) },
	"Ensure": func(ctx context.Context, f *fixture, m *Manager) error {
		_, err := m.Ensure(ctx, f.want("claim-b", "1g.10gb", 6))
		return err
	},
	"Destroy": func(ctx context.Context, _ *fixture, m *Manager) error { return m.Destroy(ctx, "claim-gone") },
	"Partitions": func(ctx context.Context, _ *fixture, m *Manager) error {
		_, err := m.Partitions(ctx, []int{0})
		return err
	},
}

// TestADamagedJournalFallsBackToItsPreviousCopy damages the journal in
// each way, with its previous copy good but one write behind (it records
// claim-a's instance as being made, CIIntended): every operation goes on,
// the instance the lost write recorded as made is kept for its claim, not
// destroyed, and the damage is reported and the file kept aside.
func TestADamagedJournalFallsBackToItsPreviousCopy(t *testing.T) {
	for name, change := range damages {
		for call, first := range firstCalls {
			t.Run(name+", "+call+" first", func(t *testing.T) {
				_, ctx := ktesting.NewTestContext(t)
				f := newFixture(t, "dgx-h100")
				f.enable()
				f.foreign()
				w := f.want("claim-a", "2g.20gb", 4)
				inst, err := f.manager(nil).Ensure(ctx, w)
				if err != nil {
					t.Fatal(err)
				}
				layout := f.layout()
				f.damage("current", change)
				warned := &warnings{}
				m := f.recovering(warned, nil)
				if err := first(ctx, f, m); err != nil {
					t.Fatalf("%s with a damaged journal: %v", call, err)
				}
				if got := warned.got(); !slices.Equal(got, []string{ReasonMIGJournalRecovered}) {
					t.Errorf("warnings = %v, want %s", got, ReasonMIGJournalRecovered)
				}
				if kept, _ := filepath.Glob(filepath.Join(f.dir, JournalFile+".corrupt-*")); len(kept) != 1 {
					t.Errorf("damaged copies kept: %v, want the one file", kept)
				}
				if err := m.Reconcile(ctx, held("claim-a", "claim-b")); err != nil {
					t.Fatal(err)
				}
				if got, ok, err := m.Lookup(w.Claim, w.Device); err != nil || !ok || got.UUID != inst.UUID {
					t.Fatalf("Lookup = %+v %v %v, want claim-a's instance %s kept", got, ok, err, inst.UUID)
				}
				if got := f.layout(); !slices.Contains(got, "14@{4}:2/1") || !slices.Contains(got, "19@{0}:1/1") || !slices.Contains(got, "19@{1}:1/0") {
					t.Fatalf("layout = %v, want claim-a's and the administrator's instances of %v", got, layout)
				}
				if err := m.Destroy(ctx, w.Claim); err != nil {
					t.Fatal(err)
				}
				if got := f.layout(); slices.Contains(got, "14@{4}:2/1") {
					t.Errorf("after claim-a's unprepare the GPU holds %v, want its instance destroyed", got)
				}
			})
		}
	}
}

// TestAJournalDamagedInBothCopiesIsRebuilt damages both copies: the
// journal is rebuilt from NVML and the seat checkpoint. The instance of a
// claim the checkpoint holds is recorded for it again, and never
// destroyed; the instance of a claim it does not hold, and the
// administrator's, are left as instances the plugin did not make. No
// operation fails.
func TestAJournalDamagedInBothCopiesIsRebuilt(t *testing.T) {
	for name, change := range damages {
		for call, first := range firstCalls {
			t.Run(name+", "+call+" first", func(t *testing.T) {
				_, ctx := ktesting.NewTestContext(t)
				f := newFixture(t, "dgx-h100")
				f.enable()
				f.foreign()
				a, x := f.want("claim-a", "2g.20gb", 4), f.want("claim-x", "1g.10gb", 3)
				for _, w := range []Want{a, x} {
					if _, err := f.manager(nil).Ensure(ctx, w); err != nil {
						t.Fatal(err)
					}
				}
				layout := f.layout()
				f.damage("current", change)
				f.damage("prev", change)
				warned := &warnings{}
				// The checkpoint holds claim-a alone: claim-x's unprepare
				// was lost with the journal.
				m := f.recovering(warned, holding(a))
				if err := first(ctx, f, m); err != nil {
					t.Fatalf("%s with both copies damaged: %v", call, err)
				}
				if got := warned.got(); !slices.Equal(got, []string{ReasonMIGJournalRebuilt}) {
					t.Errorf("warnings = %v, want %s", got, ReasonMIGJournalRebuilt)
				}
				if kept, _ := filepath.Glob(filepath.Join(f.dir, JournalFile+"*.corrupt-*")); len(kept) != 2 {
					t.Errorf("damaged copies kept: %v, want both", kept)
				}
				if err := m.Reconcile(ctx, held("claim-a", "claim-b")); err != nil {
					t.Fatal(err)
				}
				records := f.records()
				if i := find(records, a.Claim, a.Device); i < 0 || records[i].Phase != Adopted {
					t.Fatalf("records = %v, want claim-a's instance recorded Adopted", records)
				}
				if i := find(records, x.Claim, x.Device); i >= 0 {
					t.Fatalf("records = %v, want none for claim-x, which no claim holds", records)
				}
				parts, err := m.Partitions(ctx, []int{0})
				if err != nil {
					t.Fatal(err)
				}
				var at []string
				for _, p := range parts {
					at = append(at, p.Placement.String()+":"+string(p.Claim))
				}
				if want := []string{"{0}:1:", "{1}:1:", "{3}:1:", "{4}:2:claim-a"}; !slices.Equal(at, want) {
					t.Errorf("partitions %v, want %v: claim-x's instance foreign, claim-a's its own", at, want)
				}
				if err := m.Destroy(ctx, a.Claim); err != nil {
					t.Fatal(err)
				}
				got := f.layout()
				if call == "Ensure" {
					got = slices.DeleteFunc(got, func(s string) bool { return s == "19@{6}:1/1" }) // claim-b's
				}
				if !slices.Equal(got, layout) {
					t.Errorf("the GPU holds %v, want %v: no instance destroyed", got, layout)
				}
			})
		}
	}
}

// With no seat checkpoint to tell, no instance is anyone's: the rebuilt
// journal is empty and nothing is destroyed.
func TestAJournalRebuiltWithoutTheCheckpointLeavesEveryInstance(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	if _, err := f.manager(nil).Ensure(ctx, f.want("claim-a", "2g.20gb", 4)); err != nil {
		t.Fatal(err)
	}
	layout := f.layout()
	f.damage("current", damages["garbage"])
	f.damage("prev", damages["empty"])
	warned := &warnings{}
	m := f.recovering(warned, func() ([]Want, bool) { return nil, false })
	if err := m.Reconcile(ctx, held()); err != nil {
		t.Fatal(err)
	}
	if got := f.layout(); !slices.Equal(got, layout) {
		t.Errorf("the GPU holds %v, want %v", got, layout)
	}
	if r := f.records(); len(r) != 0 {
		t.Errorf("records = %v, want none", r)
	}
	if got := warned.got(); !slices.Equal(got, []string{ReasonMIGJournalRebuilt}) {
		t.Errorf("warnings = %v", got)
	}
}

// A journal written before boot IDs and checksums (v1) is read: its made
// instance that is whole is kept, in this boot; its half-made record, and
// its made record whose instance is gone, are forgotten, with nothing
// destroyed: the boot they were written in is not known.
func TestAV1JournalIsRead(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	w := f.want("claim-a", "2g.20gb", 4)
	inst, err := f.manager(nil).Ensure(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	// An administrator's bare 1g.10gb GPU instance at slice 6, where the
	// v1 journal's half-made record below would have made one.
	one := f.profile("1g.10gb")
	info, _ := f.dev.GetGpuInstanceProfileInfo(one.Index)
	if _, ret := f.dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 6, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	layout := f.layout()
	two := f.profile("2g.20gb")
	record := func(claim string, p mig.Profile, start int, phase string, more map[string]any) map[string]any {
		r := map[string]any{"claim": claim, "device": "g0-mig-" + strings.ReplaceAll(p.Name, ".", "-") + "-" + strconv.Itoa(start), "gpu": 0, "gpuUUID": "GPU-0", "gpuMinor": 0,
			"profile": p.Name, "profileID": p.ID, "profileIndex": p.Index, "placementStart": start, "placementSize": p.MemorySlices, "phase": phase}
		maps.Copy(r, more)
		return r
	}
	v1, err := json.Marshal(map[string]any{"version": "v1", "records": []map[string]any{
		record("claim-a", two, 4, "Created", map[string]any{"gi": 5, "ci": 0, "uuid": inst.UUID}),
		record("claim-h", one, 6, "Creating", nil),
		record("claim-g", one, 2, "Created", map[string]any{"gi": 9, "ci": 0, "uuid": "MIG-gone"}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, JournalFile), v1, 0o600); err != nil {
		t.Fatal(err)
	}
	m := f.manager(nil)
	if err := m.Reconcile(ctx, held("claim-a", "claim-h", "claim-g")); err != nil {
		t.Fatal(err)
	}
	if got := f.layout(); !slices.Equal(got, layout) {
		t.Errorf("the GPU holds %v, want %v", got, layout)
	}
	records := f.records()
	if len(records) != 1 || records[0].Claim != "claim-a" || records[0].Boot != f.boot || records[0].UUID != inst.UUID {
		t.Fatalf("records = %v, want claim-a's alone, in boot %s", records, f.boot)
	}
	if got, ok, err := m.Lookup(w.Claim, w.Device); err != nil || !ok || got.UUID != inst.UUID {
		t.Errorf("Lookup = %+v %v %v", got, ok, err)
	}
	raw, err := os.ReadFile(filepath.Join(f.dir, JournalFile))
	if err != nil || !strings.HasPrefix(string(raw), `{"version":"v3","checksum":"sha256:`) {
		t.Errorf("the journal is written as %.60s… (%v), want v3 with its checksums", raw, err)
	}
}
