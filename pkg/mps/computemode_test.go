package mps_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// modeCalls records every compute mode a Manager sets, in order, as
// "<uuid> EXCLUSIVE_PROCESS" or "<uuid> DEFAULT".
type modeCalls struct {
	mu    sync.Mutex
	calls []string
}

func (c *modeCalls) set(_ context.Context, uuid string, exclusive bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	mode := "DEFAULT"
	if exclusive {
		mode = "EXCLUSIVE_PROCESS"
	}
	c.calls = append(c.calls, uuid+" "+mode)
	return nil
}

func (c *modeCalls) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = nil
	return out
}

func recordingManager(t *testing.T, control, root string) (*mps.Manager, *modeCalls) {
	t.Helper()
	calls := &modeCalls{}
	m, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: calls.set, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB,
		StopTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return m, calls
}

// A group that keeps the compute mode has its daemon started, limited,
// restarted and stopped, by name too, without a single compute mode set:
// the limits are the daemon's as they are with EXCLUSIVE_PROCESS.
func TestAGroupThatKeepsTheComputeModeNeverSetsIt(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	g := mps.Group{Name: "g01-2x", UUIDs: []string{"GPU-a", "GPU-b"}, KeepComputeMode: true}
	killDaemonsAtEnd(t, control, root, g.Name)
	m, calls := recordingManager(t, control, root)
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })

	one := mps.Share(1, 4, []int64{81559, 81559})
	if err := m.Ensure(ctx, g, mps.Fixed(one)); err != nil {
		t.Fatal(err)
	}
	pipe := filepath.Join(root, g.Name, mps.PipeDir)
	if got := mpstest.Join(t, control, pipe, "100", "0=80G,1=80G"); got != "thread=25 mem=0=20389M,1=20389M" {
		t.Errorf("a client raising its environment got %q, want the one-seat share", got)
	}
	two := mps.Share(2, 4, []int64{81559, 81559})
	if err := m.Settle(ctx, g, mps.Fixed(two)); err != nil {
		t.Fatal(err)
	}
	if got := mpstest.Join(t, control, pipe, "", ""); got != "thread=50 mem=0=40779M,1=40779M" {
		t.Errorf("a client after the share grew got %q, want the two-seat share", got)
	}
	// The daemon ends; the watcher starts it again.
	signalAll(t, daemonsOf(t, control, root, g.Name), syscall.SIGKILL)
	waitNoDaemon(t, control, root, g.Name)
	if restarted, err := m.Revive(ctx, g, mps.Fixed(two)); err != nil || !restarted {
		t.Fatalf("Revive = %v, %v; want the daemon started again", restarted, err)
	}
	// Halted (its GPU lost) and started again, then stopped by a later
	// plugin that knows the group by name only.
	if err := m.Halt(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx, g, mps.Fixed(one)); err != nil {
		t.Fatal(err)
	}
	again, againCalls := recordingManager(t, control, root)
	if err := again.Retire(ctx, mps.Group{Name: g.Name}, func() (bool, error) { return false, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, g.Name)); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory after its stop: %v", err)
	}
	if got := slices.Concat(calls.take(), againCalls.take()); len(got) > 0 {
		t.Errorf("compute modes were set for a group that keeps them: %q", got)
	}
}

// A daemon that will not start, of a group that keeps the compute mode,
// fails with its own words and sets no compute mode either.
func TestAFailedStartThatKeepsTheComputeModeSetsNone(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	script := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'An MPS control daemon could not be started: no GPU' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, calls := recordingManager(t, script, mpstest.Root(t))
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}, KeepComputeMode: true}
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 2, []int64{1024}))); err == nil || !strings.Contains(err.Error(), "no GPU") {
		t.Fatalf("Ensure = %v, want the daemon's own words", err)
	}
	if err := m.Settle(ctx, g, mps.Unused()); err != nil {
		t.Fatal(err)
	}
	if got := calls.take(); len(got) > 0 {
		t.Errorf("compute modes were set: %q", got)
	}
}

// What a daemon's start did to the compute mode is undone by its stop,
// whatever the profile says by then: a daemon started in EXCLUSIVE_PROCESS
// that ended with its GPUs left so is followed by one that keeps the mode
// only once those GPUs are DEFAULT again; a daemon that kept the mode and
// is stopped under a profile that no longer does sets nothing back.
func TestAChangeOfComputeModeUndoesOnlyWhatTheDaemonDid(t *testing.T) {
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
	// The daemon dies with the plugin's container; the GPU stays
	// EXCLUSIVE_PROCESS. The next plugin's profile keeps the mode.
	signalAll(t, daemonsOf(t, control, root, exclusive.Name), syscall.SIGKILL)
	waitNoDaemon(t, control, root, exclusive.Name)
	if err := m.Ensure(ctx, keep, limits); err != nil {
		t.Fatal(err)
	}
	// Adopted under a profile that no longer keeps it, and stopped: the
	// daemon that runs kept the mode, so nothing is set back.
	if err := m.Ensure(ctx, exclusive, limits); err != nil {
		t.Fatal(err)
	}
	if err := m.Settle(ctx, exclusive, mps.Unused()); err != nil {
		t.Fatal(err)
	}
	// Started anew under that profile: EXCLUSIVE_PROCESS, and DEFAULT
	// after.
	if err := m.Ensure(ctx, exclusive, limits); err != nil {
		t.Fatal(err)
	}
	if err := m.Settle(ctx, exclusive, mps.Unused()); err != nil {
		t.Fatal(err)
	}
	want := []string{"GPU-a EXCLUSIVE_PROCESS", "GPU-a DEFAULT", "GPU-a EXCLUSIVE_PROCESS", "GPU-a DEFAULT"}
	if got := calls.take(); !slices.Equal(got, want) {
		t.Errorf("compute modes set %q, want %q", got, want)
	}
}

// waitNoDaemon waits until no simulated daemon of the group runs.
func waitNoDaemon(t *testing.T, control, root, group string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(daemonsOf(t, control, root, group)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the daemons of %s still run: %v", group, daemonsOf(t, control, root, group))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
