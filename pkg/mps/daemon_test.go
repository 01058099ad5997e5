package mps_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// modes records compute modes as a simulated GPU would.
type modes struct {
	mu        sync.Mutex
	exclusive map[string]bool
	fail      string
}

func (m *modes) set(_ context.Context, uuid string, exclusive bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if uuid == m.fail {
		return os.ErrPermission
	}
	m.exclusive[uuid] = exclusive
	return nil
}

func (m *modes) get(uuid string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exclusive[uuid]
}

func newManager(t *testing.T, control string) (*mps.Manager, *modes, string) {
	t.Helper()
	root := t.TempDir()
	mpstest.UnmountAtEnd(t, root)
	md := &modes{exclusive: map[string]bool{}}
	m, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: md.set, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		t.Fatal(err)
	}
	return m, md, root
}

func TestDaemonHoldsTheLargestShareAndTheEnvironmentOnlyLowersIt(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := newManager(t, control)
	g := mps.Group{Name: "g01-2x", UUIDs: []string{"GPU-a", "GPU-b"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })

	one := mps.Share(1, 4, []int64{81559, 81559})
	if err := m.Ensure(ctx, g, mps.Fixed(one)); err != nil {
		t.Fatal(err)
	}
	if !md.get("GPU-a") || !md.get("GPU-b") {
		t.Errorf("GPUs not in EXCLUSIVE_PROCESS while the daemon runs: %v", md.exclusive)
	}
	pipe := filepath.Join(root, g.Name, mps.PipeDir)
	if got := mpstest.Join(t, control, pipe, "25", one.MemLimitEnv()); got != "thread=25 mem=0=20389M,1=20389M" {
		t.Errorf("a one-seat client got %q", got)
	}
	// A tenant that raises its own environment keeps the daemon's limit.
	if got := mpstest.Join(t, control, pipe, "100", "0=80G,1=80G"); got != "thread=25 mem=0=20389M,1=20389M" {
		t.Errorf("a client raising its environment got %q, want the daemon's one-seat share", got)
	}
	// A two-seat claim joins: the daemon and its running server now hold
	// two seats' share, which a one-seat client's environment lowers.
	two := mps.Share(2, 4, []int64{81559, 81559})
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Max(one, two))); err != nil {
		t.Fatal(err)
	}
	if got := mpstest.Join(t, control, pipe, "50", two.MemLimitEnv()); got != "thread=50 mem=0=40779M,1=40779M" {
		t.Errorf("a two-seat client got %q", got)
	}
	if got := mpstest.Join(t, control, pipe, "25", one.MemLimitEnv()); got != "thread=25 mem=0=20389M,1=20389M" {
		t.Errorf("a one-seat client beside a two-seat one got %q", got)
	}
	cmds := mpstest.Commands(t, filepath.Join(root, g.Name, mps.LogDir))
	for _, want := range []string{
		"set_default_active_thread_percentage 25", "set_default_device_pinned_mem_limit 1 20389M",
		"set_default_active_thread_percentage 50", "set_active_thread_percentage 4001 50", "set_device_pinned_mem_limit 4001 0 40779M",
	} {
		if !slices.Contains(cmds, want) {
			t.Errorf("the daemon never got %q; it got %q", want, cmds)
		}
	}

	if err := m.Settle(ctx, g, mps.Unused()); err != nil {
		t.Fatal(err)
	}
	if md.get("GPU-a") || md.get("GPU-b") {
		t.Errorf("GPUs still EXCLUSIVE_PROCESS after the daemon stopped")
	}
	if _, err := os.Stat(filepath.Join(root, g.Name)); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory is left: %v", err)
	}
}

func TestASecondManagerAdoptsTheRunningDaemon(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := newManager(t, control)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	limits := mps.Share(1, 2, []int64{40960})
	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	// A restarted plugin: a new manager over the same directory.
	again, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: md.set, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		t.Fatal(err)
	}
	if known, err := again.Known(); err != nil || !slices.Equal(known, []string{g.Name}) {
		t.Errorf("Known = %v, %v", known, err)
	}
	if err := again.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, g.Name, mps.LogDir, "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "Control daemon started"); n != 1 {
		t.Errorf("the daemon was started %d times, want once (adopted after the restart):\n%s", n, data)
	}
}

// The two plugin processes of a rolling update share the daemons, and
// each sets limits on them. The new one set a one-seat share, the old one
// raised it for its three-seat claim, and that claim is released through
// the new one, whose largest share is one seat again: the daemon goes
// back to the one-seat share, which a client that drops its environment
// gets. What a daemon holds is kept with its record, not in a process.
func TestAPeersLimitsAreLoweredAfterItsClaimsRelease(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	killDaemonsAtEnd(t, control, root, g.Name)
	one := mps.Share(1, 4, []int64{40960})
	three := mps.Share(3, 4, []int64{40960})
	old, _ := managerOn(t, control, root)
	next, _ := managerOn(t, control, root)
	t.Cleanup(func() { _ = next.Settle(context.Background(), g, mps.Unused()) })

	if err := old.Ensure(ctx, g, mps.Fixed(one)); err != nil {
		t.Fatal(err)
	}
	if err := next.Ensure(ctx, g, mps.Fixed(one)); err != nil { // the new process's start
		t.Fatal(err)
	}
	if err := old.Ensure(ctx, g, mps.Fixed(three)); err != nil { // a prepare on the old one
		t.Fatal(err)
	}
	if err := next.Settle(ctx, g, mps.Fixed(one)); err != nil { // the release, on the new one
		t.Fatal(err)
	}
	if _, err := next.Revive(ctx, g, mps.Fixed(one)); err != nil { // and its watcher
		t.Fatal(err)
	}
	logDir := filepath.Join(root, g.Name, mps.LogDir)
	if got := mpstest.LastCommand(t, logDir, "set_default_active_thread_percentage"); got != "set_default_active_thread_percentage 25" {
		t.Errorf("the daemon's default after the release: %q, want the one-seat share (25)", got)
	}
	if got := mpstest.Join(t, control, filepath.Join(root, g.Name, mps.PipeDir), "", ""); got != "thread=25 mem=0=10240M" {
		t.Errorf("a client without the limits in its environment got %q, want the largest share held (thread=25 mem=0=10240M)", got)
	}
	// Limits that stand are not set again, whichever process set them.
	before := len(mpstest.Commands(t, logDir))
	if err := old.Settle(ctx, g, mps.Fixed(one)); err != nil {
		t.Fatal(err)
	}
	if cmds := mpstest.Commands(t, logDir); len(cmds) != before {
		t.Errorf("the daemon was told %q again, with its limits as wanted", cmds[before:])
	}
}

func TestADaemonThatWillNotStartFailsWithItsOutput(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	script := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'An MPS control daemon could not be started: no GPU' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, md, _ := newManager(t, script)
	err := m.Ensure(ctx, mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}, mps.Fixed(mps.Share(1, 2, []int64{1024})))
	if err == nil || !strings.Contains(err.Error(), "could not be started: no GPU") || !strings.Contains(err.Error(), "start MPS daemon g0-1x") {
		t.Fatalf("Ensure = %v, want the daemon's own words", err)
	}
	if md.get("GPU-a") {
		t.Errorf("a GPU stays EXCLUSIVE_PROCESS after a failed start")
	}
}

func TestAGPUThatRefusesItsComputeModeFailsTheStart(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, md, _ := newManager(t, mpstest.Build(t))
	md.fail = "GPU-b"
	err := m.Ensure(ctx, mps.Group{Name: "g01-2x", UUIDs: []string{"GPU-a", "GPU-b"}}, mps.Fixed(mps.Share(1, 2, []int64{1024, 1024})))
	if err == nil || !strings.Contains(err.Error(), "set GPU GPU-b to EXCLUSIVE_PROCESS") {
		t.Fatalf("Ensure = %v", err)
	}
	if md.get("GPU-a") {
		t.Errorf("GPU-a stays EXCLUSIVE_PROCESS after its pair refused")
	}
}

// A later plugin whose plan lacks a group stops its daemon by name alone,
// and still gives its GPUs back in compute mode DEFAULT.
func TestADaemonStoppedByNameGivesItsGPUsBack(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := newManager(t, control)
	g := mps.Group{Name: "g01-2x", UUIDs: []string{"GPU-a", "GPU-b"}}
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 2, []int64{40960, 40960}))); err != nil {
		t.Fatal(err)
	}
	if !md.get("GPU-a") || !md.get("GPU-b") {
		t.Fatal("the group's GPUs are not EXCLUSIVE_PROCESS while its daemon runs")
	}
	again, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: md.set, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Settle(ctx, mps.Group{Name: g.Name}, mps.Unused()); err != nil {
		t.Fatal(err)
	}
	if md.get("GPU-a") || md.get("GPU-b") {
		t.Error("a daemon stopped by name left its GPUs in EXCLUSIVE_PROCESS")
	}
	if _, err := os.Stat(filepath.Join(root, g.Name)); !os.IsNotExist(err) {
		t.Errorf("its directory: %v", err)
	}
}

// The daemons of different groups are started, limited and stopped at
// once (each group has its own lock), as the prepares of two groups and
// the watcher do: what the Manager keeps of all of them must allow it
// (go test -race).
func TestDaemonsOfTwoGroupsAtOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, _, _ := newManager(t, control)
	groups := []mps.Group{{Name: "g0-1x", UUIDs: []string{"GPU-a"}}, {Name: "g1-1x", UUIDs: []string{"GPU-b"}}}
	var wg sync.WaitGroup
	errs := make([]error, len(groups))
	for i, g := range groups {
		wg.Go(func() {
			if errs[i] = m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{81559}))); errs[i] != nil {
				return
			}
			if _, errs[i] = m.Revive(ctx, g, mps.Fixed(mps.Share(2, 4, []int64{81559}))); errs[i] != nil {
				return
			}
			errs[i] = m.Settle(ctx, g, mps.Unused())
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("group %s: %v", groups[i].Name, err)
		}
	}
}
