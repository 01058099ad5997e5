package mps_test

import (
	"context"
	"syscall"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// The wide group's daemon (EXCLUSIVE_PROCESS) could not be confirmed
// stopped and ended later on its own; before the watcher came around, a
// group that keeps the compute mode started its daemon on GPU-a. The
// wide group's stop, finished now, leaves GPU-a EXCLUSIVE_PROCESS because
// that daemon serves it; once that daemon stops too, nothing the plugin
// did may stay behind: GPU-a must be DEFAULT again. A kept group's stop
// sets nothing, so the EXCLUSIVE_PROCESS the wide group's start set is
// never undone.
func TestAKeptDaemonBesideAnUnfinishedExclusiveStopLeavesNoGPUExclusive(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	wide := wideGroup
	narrow := narrowGroup
	narrow.KeepComputeMode = true
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
		t.Fatalf("start of the kept group on a GPU whose other daemon has ended: %v", err)
	}
	if _, err := m.Revive(ctx, wide, mps.Unused()); err != nil {
		t.Fatalf("finishing the wide group's stop: %v", err)
	}
	if err := m.Settle(ctx, narrow, mps.Unused()); err != nil {
		t.Fatalf("stop of the kept group: %v", err)
	}
	if got := daemonsOf(t, control, root, narrow.Name); len(got) > 0 {
		t.Fatalf("daemons of group %s after its stop: %v", narrow.Name, got)
	}
	if md.get("GPU-a") {
		t.Error("GPU-a stays in compute mode EXCLUSIVE_PROCESS with no daemon left on it: the wide group's start set it, its stop left it to the kept group's daemon, and that daemon's stop sets nothing back")
	}
	if md.get("GPU-b") {
		t.Error("GPU-b stays in compute mode EXCLUSIVE_PROCESS")
	}
}

// A group's daemon ran in EXCLUSIVE_PROCESS and was stopped (its GPU was
// lost: Halt keeps its directories), which set its GPU back to DEFAULT.
// An administrator then sets the GPU's compute mode as the node needs it.
// The group's next daemon keeps the compute mode: its start must set no
// mode, for nothing the plugin did is left to undo.
func TestAKeptStartAfterACompletedStopSetsNoComputeMode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	exclusive := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	keep := mps.Group{Name: exclusive.Name, UUIDs: exclusive.UUIDs, KeepComputeMode: true}
	killDaemonsAtEnd(t, control, root, exclusive.Name)
	m, calls := recordingManager(t, control, root)
	t.Cleanup(func() { _ = m.Settle(context.Background(), keep, mps.Unused()) })
	limits := mps.Fixed(mps.Share(1, 2, []int64{40960}))

	if err := m.Ensure(ctx, exclusive, limits); err != nil {
		t.Fatal(err)
	}
	if err := m.Halt(ctx, exclusive); err != nil {
		t.Fatal(err)
	}
	if got := calls.take(); len(got) != 2 || got[0] != "GPU-a EXCLUSIVE_PROCESS" || got[1] != "GPU-a DEFAULT" {
		t.Fatalf("compute modes of the exclusive daemon's start and stop: %q", got)
	}
	if err := m.Ensure(ctx, keep, limits); err != nil {
		t.Fatal(err)
	}
	if err := m.Settle(ctx, keep, mps.Unused()); err != nil {
		t.Fatal(err)
	}
	if got := calls.take(); len(got) > 0 {
		t.Errorf("the daemon of a group that keeps the compute mode, after a stop that had set everything back, set compute modes %q", got)
	}
}
