package miginstance

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// crashAt stops the manager at its kth step, as a crash of the plugin
// would, and counts the steps it reached.
type crashAt struct {
	k, n int
}

func (c *crashAt) step(string) bool {
	c.n++
	return c.n == c.k
}

func held(uids ...types.UID) Prepared {
	return func() (map[types.UID]bool, bool) {
		m := map[types.UID]bool{}
		for _, u := range uids {
			m[u] = true
		}
		return m, true
	}
}

// outcome checks GPU 0 holds the foreign instances and, if ours, the
// claim's instance alone, and that the journal records exactly that.
func (f *fixture) outcome(foreign []string, ours bool) {
	f.t.Helper()
	want := slices.Clone(foreign)
	if ours {
		want = append(want, "14@{4}:2/1")
		slices.Sort(want)
	}
	if got := f.layout(); !slices.Equal(got, want) {
		f.t.Fatalf("layout = %v, want %v (foreign %v)", got, want, foreign)
	}
	records := f.records()
	if ours {
		if len(records) != 1 || records[0].Phase != Created {
			f.t.Fatalf("records = %v, want claim-a's, Created", records)
		}
		inst, ok, err := f.manager(nil).Lookup("claim-a", "g0-mig-2g-20gb-4")
		if err != nil || !ok {
			f.t.Fatalf("Lookup: %v %v", ok, err)
		}
		if _, err := f.sim.MIGDeviceNodes(inst.UUID); err != nil {
			f.t.Fatalf("the recorded UUID is no live MIG device: %v", err)
		}
	} else if len(records) != 0 {
		f.t.Fatalf("records = %v, want none", records)
	}
}

// TestCrashBetweenAnyTwoSteps stops a prepare (Ensure) at every step in
// turn, restarts (a new manager over the journal, Reconcile), and then
// either retries the prepare (the claim still holds its seat) or finds
// the claim released; it does the same for an unprepare (Destroy). Every
// time: the claim's instance exists once or not at all as it should, no
// instance is left that no record names, and the foreign instances stay.
func TestCrashBetweenAnyTwoSteps(t *testing.T) {
	for _, released := range []bool{false, true} {
		for k := 1; ; k++ {
			_, ctx := ktesting.NewTestContext(t)
			f := newFixture(t, "dgx-h100")
			f.enable()
			f.foreign()
			foreign := f.layout()
			w := f.want("claim-a", "2g.20gb", 4)
			c := &crashAt{k: k}
			_, err := f.manager(c.step).Ensure(ctx, w)
			if c.n < k {
				if err != nil {
					t.Fatalf("Ensure with no crash: %v", err)
				}
				break // every step crashed once
			}
			if !errors.Is(err, errCrashed) {
				t.Fatalf("step %d: Ensure = %v, want the crash", k, err)
			}
			m := f.manager(nil)
			if released {
				if err := m.Reconcile(ctx, held()); err != nil {
					t.Fatalf("step %d: Reconcile: %v", k, err)
				}
				f.outcome(foreign, false)
				continue
			}
			if err := m.Reconcile(ctx, held("claim-a")); err != nil {
				t.Fatalf("step %d: Reconcile: %v", k, err)
			}
			if _, err := m.Ensure(ctx, w); err != nil {
				t.Fatalf("step %d: the retried Ensure: %v", k, err)
			}
			f.outcome(foreign, true)
		}
	}
	for k := 1; ; k++ {
		_, ctx := ktesting.NewTestContext(t)
		f := newFixture(t, "dgx-h100")
		f.enable()
		f.foreign()
		foreign := f.layout()
		if _, err := f.manager(nil).Ensure(ctx, f.want("claim-a", "2g.20gb", 4)); err != nil {
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
		// The kubelet retries the unprepare after the restart.
		m := f.manager(nil)
		if err := m.Reconcile(ctx, held("claim-a")); err != nil {
			t.Fatalf("step %d of Destroy: Reconcile: %v", k, err)
		}
		if err := m.Destroy(ctx, "claim-a"); err != nil {
			t.Fatalf("step %d of Destroy: the retried Destroy: %v", k, err)
		}
		f.outcome(foreign, false)
	}
}

// TestFailedNVMLCallAtEachCall fails each MIG call, first to fourth of its
// kind, during a prepare: the prepare either succeeds or fails leaving
// nothing of its own (or a record Reconcile settles), and a retry makes
// the instance once; the foreign instances stay throughout.
func TestFailedNVMLCallAtEachCall(t *testing.T) {
	for _, call := range simnode.MIGCalls() {
		for nth := 1; nth <= 4; nth++ {
			_, ctx := ktesting.NewTestContext(t)
			f := newFixture(t, "dgx-h100")
			f.enable()
			f.foreign()
			foreign := f.layout()
			w := f.want("claim-a", "2g.20gb", 4)
			if err := f.sim.FailCall(simnode.CallFault{Call: call, Nth: nth, Ret: nvml.ERROR_UNKNOWN}); err != nil {
				t.Fatal(err)
			}
			m := f.manager(nil)
			if _, err := m.Ensure(ctx, w); err != nil {
				// What a failed prepare leaves is nobody's until the
				// retry: settle it as a restart would, then retry.
				if err := m.Reconcile(ctx, held("claim-a")); err != nil {
					t.Fatalf("%s #%d: Reconcile: %v", call, nth, err)
				}
				if _, err := m.Ensure(ctx, w); err != nil {
					t.Fatalf("%s #%d: the retried Ensure: %v", call, nth, err)
				}
			}
			f.outcome(foreign, true)
			if err := m.Destroy(ctx, "claim-a"); err != nil {
				// A fault armed for a later call fires here: the retried
				// unprepare finishes.
				if err := m.Destroy(ctx, "claim-a"); err != nil {
					t.Fatalf("%s #%d: the retried Destroy: %v", call, nth, err)
				}
			}
			f.outcome(foreign, false)
		}
	}
}

// stepNamed stops the manager at the step of that name, as a crash would.
type stepNamed string

func (s stepNamed) step(name string) bool { return name == string(s) }

// TestAnInstanceMadeAtTheCrashedPlacementIsLeft: the plugin crashes
// before it makes its GPU instance, and an administrator makes one, with
// a compute instance, at that placement before the plugin starts again.
// The journal's record of the half-made instance does not name it, and
// neither the restart's reconcile nor the claim's retried prepare
// destroys it: the retry is refused, naming the instance in the way.
func TestAnInstanceMadeAtTheCrashedPlacementIsLeft(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, "dgx-h100")
	f.enable()
	if _, err := f.manager(stepNamed("CreateGpuInstanceWithPlacement").step).Ensure(ctx, f.want("claim-a", "1g.10gb", 0)); !errors.Is(err, errCrashed) {
		t.Fatalf("Ensure: %v, want the crash", err)
	}
	f.foreign() // 1g at {0} with a compute instance, 1g at {1} bare
	before := f.layout()
	m := f.manager(nil)
	if err := m.Reconcile(ctx, held("claim-a")); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if got := f.layout(); !slices.Equal(got, before) {
		t.Fatalf("after the restart's reconcile the GPU holds %v, want the administrator's %v", got, before)
	}
	if _, err := m.Ensure(ctx, f.want("claim-a", "1g.10gb", 0)); err == nil || !strings.Contains(err.Error(), "not this claim's") {
		t.Fatalf("retried Ensure: %v, want a refusal naming the instance at the placement", err)
	}
	if got := f.layout(); !slices.Equal(got, before) {
		t.Fatalf("after the retried prepare the GPU holds %v, want the administrator's %v", got, before)
	}
}
