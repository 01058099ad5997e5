package mps_test

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// Groups that share a GPU: profiles "2x" and "1x" over the same GPUs,
// which the configuration allows and the ledger only keeps from being
// held at once.
var (
	wideGroup   = mps.Group{Name: "g01-2x", UUIDs: []string{"GPU-a", "GPU-b"}}
	narrowGroup = mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
)

// The stop of the wide group's daemon cannot be confirmed (it is
// SIGSTOPped), so the ledger has freed its GPUs while it still runs: a
// daemon of the narrow group must not start on GPU-a beside it; the
// prepare that wants it fails with the reason. Once the wide daemon has
// ended and the watcher finished its stop, the narrow group's daemon
// starts, alone on GPU-a, which stays EXCLUSIVE_PROCESS.
func TestADaemonDoesNotStartOnAGPUWhereAnotherGroupsStopIsPending(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	wide, narrow := wideGroup, narrowGroup
	killDaemonsAtEnd(t, control, root, wide.Name)
	killDaemonsAtEnd(t, control, root, narrow.Name)
	t.Cleanup(func() { _ = m.Settle(context.Background(), narrow, mps.Unused()) })

	if err := m.Ensure(ctx, wide, mps.Fixed(mps.Share(1, 1, []int64{40960, 40960}))); err != nil {
		t.Fatal(err)
	}
	widePIDs := daemonsOf(t, control, root, wide.Name)
	mpstest.Stop(t, widePIDs...)
	if err := m.Settle(ctx, wide, mps.Unused()); err == nil {
		t.Fatal("the stop of a SIGSTOPped daemon was reported done")
	}

	err := m.Ensure(ctx, narrow, mps.Fixed(mps.Share(1, 1, []int64{40960})))
	if got := daemonsOf(t, control, root, narrow.Name); err == nil || len(got) > 0 {
		t.Errorf("a daemon of group %s started (%v; Ensure: %v) on GPU-a, which the daemon of group %s %v still serves", narrow.Name, got, err, wide.Name, widePIDs)
	} else if !strings.Contains(err.Error(), "GPU GPU-a is served by the MPS daemon of group g01-2x") {
		t.Errorf("Ensure: %v, want the reason: GPU-a is served by group %s's daemon", err, wide.Name)
	}

	// The wide group's daemon can end now; the watcher finishes its stop,
	// and the prepare, retried, starts the narrow group's daemon.
	signalAll(t, widePIDs, syscall.SIGCONT)
	waitUntil(t, "the wide group's daemon to end", func() bool { return len(daemonsOf(t, control, root, wide.Name)) == 0 })
	if _, err := m.Revive(ctx, wide, mps.Unused()); err != nil {
		t.Fatalf("finishing the wide group's stop: %v", err)
	}
	if err := m.Ensure(ctx, narrow, mps.Fixed(mps.Share(1, 1, []int64{40960}))); err != nil {
		t.Fatalf("the retried prepare once the wide group's daemon ended: %v", err)
	}
	if got := daemonsOf(t, control, root, narrow.Name); len(got) != 1 || !md.get("GPU-a") || md.get("GPU-b") {
		t.Errorf("daemons of group %s %v, GPU-a exclusive %v, GPU-b exclusive %v: want one daemon, GPU-a EXCLUSIVE_PROCESS, GPU-b DEFAULT", narrow.Name, got, md.get("GPU-a"), md.get("GPU-b"))
	}
}

// The wide group's stop failed, its daemon ended later on its own, and a
// daemon of the narrow group started on GPU-a before the watcher came
// around: the wide group's stop, finished now, gives back GPU-b only;
// GPU-a stays EXCLUSIVE_PROCESS under the narrow group's daemon, whose
// processes would otherwise bypass MPS.
func TestAStopLeavesExclusiveTheGPUsAnotherGroupsDaemonServes(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	wide, narrow := wideGroup, narrowGroup
	killDaemonsAtEnd(t, control, root, wide.Name)
	killDaemonsAtEnd(t, control, root, narrow.Name)
	t.Cleanup(func() { _ = m.Settle(context.Background(), narrow, mps.Unused()) })

	if err := m.Ensure(ctx, wide, mps.Fixed(mps.Share(1, 1, []int64{40960, 40960}))); err != nil {
		t.Fatal(err)
	}
	widePIDs := daemonsOf(t, control, root, wide.Name)
	mpstest.Stop(t, widePIDs...)
	if err := m.Settle(ctx, wide, mps.Unused()); err == nil {
		t.Fatal("the stop of a SIGSTOPped daemon was reported done")
	}
	signalAll(t, widePIDs, syscall.SIGCONT)
	waitUntil(t, "the wide group's daemon to end", func() bool { return len(daemonsOf(t, control, root, wide.Name)) == 0 })

	if err := m.Ensure(ctx, narrow, mps.Fixed(mps.Share(1, 1, []int64{40960}))); err != nil {
		t.Fatalf("start on a GPU whose other daemon has ended: %v", err)
	}
	if _, err := m.Revive(ctx, wide, mps.Unused()); err != nil {
		t.Fatalf("finishing the wide group's stop: %v", err)
	}
	if got := daemonsOf(t, control, root, narrow.Name); len(got) != 1 {
		t.Fatalf("daemons of group %s: %v, want one", narrow.Name, got)
	}
	if !md.get("GPU-a") {
		t.Errorf("GPU-a is in compute mode DEFAULT while the daemon of group %s serves it: its processes bypass MPS", narrow.Name)
	}
	if md.get("GPU-b") {
		t.Error("GPU-b, which no daemon serves any more, stays EXCLUSIVE_PROCESS")
	}
}
