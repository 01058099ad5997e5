package mps_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// What a tenant can do to its group's daemon from a container that has
// the pipe directory mounted read-write (--mps-pipe-read-only=false), or
// what befalls a daemon on the host, done here directly to the host's
// directories and processes, through the simulated daemon.

// tenantManager is a Manager over a short root (socket paths must fit in
// 108 bytes) with waits short enough for a test.
func tenantManager(t *testing.T, control string, mutate ...func(*mps.Options)) (*mps.Manager, *modes, string) {
	t.Helper()
	root := mpstest.Root(t)
	md := &modes{exclusive: map[string]bool{}}
	opts := mps.Options{Root: root, Control: []string{control}, SetExclusive: md.set, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB,
		ControlTimeout: 500 * time.Millisecond, StopTimeout: 500 * time.Millisecond}
	for _, f := range mutate {
		f(&opts)
	}
	m, err := mps.NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m, md, root
}

// daemonsOf are the PIDs of the simulated daemons serving root's group.
func daemonsOf(t *testing.T, control, root, group string) []int {
	t.Helper()
	var pids []int
	for pid, pipe := range mpstest.Daemons(t, control) {
		if pipe == filepath.Join(root, group, mps.PipeDir) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

func signalAll(t *testing.T, pids []int, sig syscall.Signal) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatalf("signal %d: %v", pid, err)
		}
	}
}

// A tenant replaces its group's control socket with a link to another
// group's: neither the limits the plugin sets on its group's daemon nor
// the quit of its last release may reach the other group's daemon, which
// keeps running, its GPU EXCLUSIVE_PROCESS.
func TestALinkToAnotherGroupsSocketReachesNoOtherDaemon(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	a := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	b := mps.Group{Name: "g1-1x", UUIDs: []string{"GPU-b"}}
	for _, g := range []mps.Group{a, b} {
		if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	}
	bLog := filepath.Join(root, b.Name, mps.LogDir)
	before := len(mpstest.Commands(t, bLog))
	aDaemons := daemonsOf(t, control, root, a.Name)

	ctl := filepath.Join(root, a.Name, mps.PipeDir, mps.ControlSocket)
	if err := os.Remove(ctl); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, b.Name, mps.PipeDir, mps.ControlSocket), ctl); err != nil {
		t.Fatal(err)
	}
	// A second claim changes group a's share, then both go.
	if err := m.Ensure(ctx, a, mps.Fixed(mps.Share(2, 4, []int64{40960}))); err != nil {
		t.Logf("Ensure with a planted link: %v", err)
	}
	if err := m.Settle(ctx, a, mps.Unused()); err != nil {
		t.Fatalf("the release of group a's last seat: %v", err)
	}

	if cmds := mpstest.Commands(t, bLog); len(cmds) != before {
		t.Errorf("group b's daemon got commands meant for group a: %q", cmds[before:])
	}
	if got := daemonsOf(t, control, root, b.Name); len(got) != 1 {
		t.Errorf("group b's daemons %v, want its one daemon still running", got)
	}
	if got := mpstest.Join(t, control, filepath.Join(root, b.Name, mps.PipeDir), "", ""); got != "thread=25 mem=0=10240M" {
		t.Errorf("a client of group b got %q", got)
	}
	if !md.get("GPU-b") {
		t.Error("group b's GPU left EXCLUSIVE_PROCESS while its daemon runs")
	}
	if got := daemonsOf(t, control, root, a.Name); len(got) != 0 {
		t.Errorf("group a's daemons %v (first %v) still run after its group's last release", got, aDaemons)
	}
	if md.get("GPU-a") {
		t.Error("group a's GPU stays EXCLUSIVE_PROCESS after its daemon stopped")
	}
}

// A daemon that does not answer (stopped with SIGSTOP) and does not end on
// SIGTERM is not reported stopped: the stop fails, its GPU stays
// EXCLUSIVE_PROCESS and its directory stays. Once it can end (SIGCONT,
// and the pending SIGTERM ends it), the next stop completes.
func TestADaemonThatDoesNotEndIsNotReportedStopped(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); err != nil {
		t.Fatal(err)
	}
	pids := daemonsOf(t, control, root, g.Name)
	t.Cleanup(func() { _ = syscall.Kill(pids[0], syscall.SIGKILL) })
	mpstest.Stop(t, pids...)

	err := m.Settle(ctx, g, mps.Unused())
	if err == nil || !strings.Contains(err.Error(), "still runs") {
		t.Fatalf("stop of a daemon that does not end: %v, want an error saying it still runs", err)
	}
	if !md.get("GPU-a") {
		t.Error("the GPU of a daemon still running went back to DEFAULT")
	}
	if _, err := os.Stat(filepath.Join(root, g.Name, mps.PipeDir)); err != nil {
		t.Errorf("the directory of a daemon still running: %v", err)
	}
	if got := daemonsOf(t, control, root, g.Name); !slices.Equal(got, pids) {
		t.Errorf("daemons %v, want %v still there", got, pids)
	}

	signalAll(t, pids, syscall.SIGCONT)
	if err := m.Settle(ctx, g, mps.Unused()); err != nil {
		t.Fatalf("stop once the daemon can end: %v", err)
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 0 {
		t.Errorf("daemons %v after the stop", got)
	}
	if md.get("GPU-a") {
		t.Error("the GPU stays EXCLUSIVE_PROCESS after its daemon ended")
	}
	if _, err := os.Stat(filepath.Join(root, g.Name)); !os.IsNotExist(err) {
		t.Errorf("the directory after the stop: %v", err)
	}
}

// A tenant removes its group's control socket: the next prepare must not
// start a second daemon beside the first on the same GPUs. The first is
// stopped by its PID, and one daemon, answering, serves the group.
func TestARemovedSocketDoesNotStartASecondDaemon(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, _, root := tenantManager(t, control)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	limits := mps.Share(1, 4, []int64{40960})
	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	first := daemonsOf(t, control, root, g.Name)
	pipe := filepath.Join(root, g.Name, mps.PipeDir)
	if err := os.Remove(filepath.Join(pipe, mps.ControlSocket)); err != nil {
		t.Fatal(err)
	}

	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatalf("prepare after the socket was removed: %v", err)
	}
	now := daemonsOf(t, control, root, g.Name)
	if len(now) != 1 || slices.Equal(now, first) {
		t.Errorf("daemons of the group %v (the first was %v), want one new daemon", now, first)
	}
	if got := mpstest.Join(t, control, pipe, "", ""); got != "thread=25 mem=0=10240M" {
		t.Errorf("a client got %q from the daemon", got)
	}
}

// A daemon that dies while its group is in use is started again by
// Revive, with the limits wanted; a daemon that runs is left alone.
func TestReviveStartsADaemonThatDiedAgain(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	limits := mps.Share(2, 4, []int64{40960})
	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	if restarted, err := m.Revive(ctx, g, mps.Fixed(limits)); restarted || err != nil {
		t.Fatalf("Revive of a running daemon: %v, %v", restarted, err)
	}
	first := daemonsOf(t, control, root, g.Name)
	signalAll(t, first, syscall.SIGKILL)
	waitUntil(t, "the killed daemon to end", func() bool { return len(daemonsOf(t, control, root, g.Name)) == 0 })

	restarted, err := m.Revive(ctx, g, mps.Fixed(limits))
	if !restarted || err != nil {
		t.Fatalf("Revive of a daemon that died: %v, %v", restarted, err)
	}
	if got := mpstest.Join(t, control, filepath.Join(root, g.Name, mps.PipeDir), "", ""); got != "thread=50 mem=0=20480M" {
		t.Errorf("a client of the restarted daemon got %q", got)
	}
	if !md.get("GPU-a") {
		t.Error("the GPU is not EXCLUSIVE_PROCESS under the restarted daemon")
	}
	// A change of share that the watcher sees before the release's settle
	// does is applied, not lost.
	if restarted, err := m.Revive(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); restarted || err != nil {
		t.Fatalf("Revive with a new share: %v, %v", restarted, err)
	}
	if got := mpstest.LastCommand(t, filepath.Join(root, g.Name, mps.LogDir), "set_default_active_thread_percentage"); got != "set_default_active_thread_percentage 25" {
		t.Errorf("the daemon's last default after Revive with a one-seat share: %q", got)
	}
}

// A daemon of a group in use dies, and its first restart fails (the
// daemon exits at once: a transient failure). The group still wants a
// daemon: once a start can succeed again, the watcher's next round
// starts it, and the GPU, given back to DEFAULT while none ran, is
// EXCLUSIVE_PROCESS again.
func TestAFailedRestartIsTriedAgainByTheWatcher(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	marker := filepath.Join(t.TempDir(), "fail")
	wrapper := filepath.Join(t.TempDir(), "control.sh")
	script := "#!/bin/sh\nif [ \"$1\" = -f ] && [ -e " + marker + " ]; then echo transient failure >&2; exit 1; fi\nexec " + control + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	m, md, root := tenantManager(t, wrapper)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	killDaemonsAtEnd(t, control, root, g.Name)
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	limits := mps.Fixed(mps.Share(1, 4, []int64{40960}))
	if err := m.Ensure(ctx, g, limits); err != nil {
		t.Fatal(err)
	}
	signalAll(t, daemonsOf(t, control, root, g.Name), syscall.SIGKILL)
	waitUntil(t, "the killed daemon to end", func() bool { return len(daemonsOf(t, control, root, g.Name)) == 0 })

	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if restarted, err := m.Revive(ctx, g, limits); restarted || err == nil || !strings.Contains(err.Error(), "transient failure") {
		t.Fatalf("Revive with a daemon that exits at once: %v, %v; want a failure with the daemon's words", restarted, err)
	}
	if md.get("GPU-a") {
		t.Error("GPU-a stays EXCLUSIVE_PROCESS while no daemon runs")
	}
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	if restarted, err := m.Revive(ctx, g, limits); !restarted || err != nil {
		t.Errorf("the watcher's next round, once a start can succeed: restarted %v, %v; want the daemon started", restarted, err)
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 1 || !md.get("GPU-a") {
		t.Errorf("daemons of group %s, in use: %v, GPU-a exclusive %v; want one daemon, GPU-a EXCLUSIVE_PROCESS", g.Name, got, md.get("GPU-a"))
	}
	if got := mpstest.Join(t, control, filepath.Join(root, g.Name, mps.PipeDir), "", ""); got != "thread=25 mem=0=10240M" {
		t.Errorf("a client of the restarted daemon got %q", got)
	}
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The daemon of a group that no longer uses MPS stays while a claim holds
// the group; if it ends meanwhile, it is not started again, and its GPU
// goes back to DEFAULT at once (no daemon bypasses), its directories kept
// for the claim's containers until the group is free.
func TestARetiredDaemonThatEndsGivesItsGPUBack(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); err != nil {
		t.Fatal(err)
	}
	held := func() (bool, error) { return true, nil }
	if err := m.Retire(ctx, g, held); err != nil {
		t.Fatal(err)
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 1 || !md.get("GPU-a") {
		t.Fatalf("a held group's daemon %v, GPU exclusive %v: want it kept", got, md.get("GPU-a"))
	}
	signalAll(t, daemonsOf(t, control, root, g.Name), syscall.SIGKILL)
	waitUntil(t, "the killed daemon to end", func() bool { return len(daemonsOf(t, control, root, g.Name)) == 0 })
	if err := m.Retire(ctx, g, held); err != nil {
		t.Fatal(err)
	}
	if md.get("GPU-a") {
		t.Error("the GPU of a retired daemon that ended stays EXCLUSIVE_PROCESS")
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 0 {
		t.Errorf("daemons %v: a retired daemon was started again", got)
	}
	if _, err := os.Stat(filepath.Join(root, g.Name, mps.PipeDir)); err != nil {
		t.Errorf("the pipe directory of a group still held: %v", err)
	}
	if err := m.Retire(ctx, g, func() (bool, error) { return false, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, g.Name)); !os.IsNotExist(err) {
		t.Errorf("the directory once the group is free: %v", err)
	}
}

// managerOn is another Manager over root, as a restarted plugin or the
// other process of a rolling update has, with its own compute modes.
func managerOn(t *testing.T, control, root string) (*mps.Manager, *modes) {
	t.Helper()
	md := &modes{exclusive: map[string]bool{}}
	m, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: md.set, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB,
		ControlTimeout: 500 * time.Millisecond, StopTimeout: 500 * time.Millisecond, StartTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return m, md
}

// killDaemonsAtEnd kills, when the test ends, every simulated daemon of
// the group, whatever the plugin recorded (some outlive their directory).
func killDaemonsAtEnd(t *testing.T, control, root, group string) {
	t.Cleanup(func() {
		for _, pid := range daemonsOf(t, control, root, group) {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}
