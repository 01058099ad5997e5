package mps_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// A daemon no record names: a plugin that died right after it started a
// daemon, before it recorded it, leaves one running in the group's
// directories, beside the record of the group's daemon before (which
// ended) or none.

// startUnrecorded starts a daemon for the group as the plugin does, in
// its own session and the group's directories, outliving them as a real
// daemon does, and records nothing.
func startUnrecorded(t *testing.T, control, root string, g mps.Group) int {
	t.Helper()
	pipe := filepath.Join(root, g.Name, mps.PipeDir)
	// The plugin clears what the last daemon left in the pipe directory.
	_ = os.Remove(filepath.Join(pipe, mps.ControlSocket))
	cmd := exec.Command(control, "-f")
	cmd.Env = []string{
		"CUDA_MPS_PIPE_DIRECTORY=" + pipe,
		"CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(root, g.Name, mps.LogDir),
		"CUDA_VISIBLE_DEVICES=" + strings.Join(g.UUIDs, ","),
		mpstest.OutliveDirEnv + "=1",
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	waitUntil(t, "the unrecorded daemon to listen", func() bool {
		c, err := net.Dial("unix", filepath.Join(pipe, mps.ControlSocket))
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	return cmd.Process.Pid
}

// A group whose recorded daemon ended, and a daemon no record names in
// its directory: the group's first daemon was killed, and the plugin
// died while it started the next one. The next plugin's prepare asks
// the unrecorded daemon to quit before it starts one: one daemon serves
// the group.
func TestADaemonNoRecordNamesIsQuitBeforeAnotherStarts(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	killDaemonsAtEnd(t, control, root, g.Name)
	limits := mps.Fixed(mps.Share(1, 4, []int64{40960}))

	first, _ := managerOn(t, control, root)
	if err := first.Ensure(ctx, g, limits); err != nil {
		t.Fatal(err)
	}
	signalAll(t, daemonsOf(t, control, root, g.Name), syscall.SIGKILL)
	waitUntil(t, "the killed daemon to end", func() bool { return len(daemonsOf(t, control, root, g.Name)) == 0 })
	orphan := startUnrecorded(t, control, root, g)

	next, md := managerOn(t, control, root)
	if err := next.Ensure(ctx, g, limits); err != nil {
		t.Fatalf("prepare after the restart: %v", err)
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 1 || slices.Contains(got, orphan) {
		t.Errorf("daemons of group %s: %v (the unrecorded one was %d), want one, started by the plugin", g.Name, got, orphan)
	}
	if !md.get("GPU-a") {
		t.Error("GPU-a is not EXCLUSIVE_PROCESS under the group's daemon")
	}
	if got := mpstest.Join(t, control, filepath.Join(root, g.Name, mps.PipeDir), "", ""); got != "thread=25 mem=0=10240M" {
		t.Errorf("a client got %q", got)
	}
}

// The same state, then the group's last release: its stop is not done
// (GPU back to DEFAULT, directory removed) until the unrecorded daemon
// has quit.
func TestAStopIsNotDoneWhileADaemonNoRecordNamesRuns(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	killDaemonsAtEnd(t, control, root, g.Name)

	first, _ := managerOn(t, control, root)
	if err := first.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); err != nil {
		t.Fatal(err)
	}
	signalAll(t, daemonsOf(t, control, root, g.Name), syscall.SIGKILL)
	waitUntil(t, "the killed daemon to end", func() bool { return len(daemonsOf(t, control, root, g.Name)) == 0 })
	orphan := startUnrecorded(t, control, root, g)

	next, md := managerOn(t, control, root)
	md.exclusive["GPU-a"] = true // as the first plugin left it
	err := next.Settle(ctx, g, mps.Unused())
	if got := daemonsOf(t, control, root, g.Name); err == nil && len(got) > 0 {
		t.Errorf("the stop of group %s was reported done (GPU-a exclusive: %v) while daemon %v (unrecorded: %d) runs", g.Name, md.get("GPU-a"), got, orphan)
	}
	if err != nil {
		t.Fatalf("the stop of a group whose unrecorded daemon takes quit: %v", err)
	}
	if md.get("GPU-a") {
		t.Error("GPU-a stays EXCLUSIVE_PROCESS after the group's stop")
	}
	if _, err := os.Stat(filepath.Join(root, g.Name)); !os.IsNotExist(err) {
		t.Errorf("the group's directory after its stop: %v", err)
	}
}

// An unrecorded daemon that does not answer (SIGSTOPped, or hung) cannot
// be asked to quit, and without its PID cannot be signalled: no daemon
// starts beside it, the start fails saying why, and the GPU stays as it
// was. Once it can answer, it is asked to quit and the group's daemon
// starts.
func TestNoDaemonStartsBesideAnUnrecordedOneThatDoesNotAnswer(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	killDaemonsAtEnd(t, control, root, g.Name)
	limits := mps.Fixed(mps.Share(1, 4, []int64{40960}))

	first, _ := managerOn(t, control, root)
	if err := first.Ensure(ctx, g, limits); err != nil {
		t.Fatal(err)
	}
	signalAll(t, daemonsOf(t, control, root, g.Name), syscall.SIGKILL)
	waitUntil(t, "the killed daemon to end", func() bool { return len(daemonsOf(t, control, root, g.Name)) == 0 })
	orphan := startUnrecorded(t, control, root, g)
	mpstest.Stop(t, orphan)

	next, _ := managerOn(t, control, root)
	err := next.Ensure(ctx, g, limits)
	if got := daemonsOf(t, control, root, g.Name); len(got) != 1 {
		t.Errorf("daemons of group %s: %v beside the unrecorded one %d that does not answer (Ensure: %v)", g.Name, got, orphan, err)
	}
	if err == nil || !strings.Contains(err.Error(), "no record names listens on") {
		t.Errorf("Ensure: %v, want the reason: a daemon no record names listens and does not answer", err)
	}

	signalAll(t, []int{orphan}, syscall.SIGCONT)
	if err := next.Ensure(ctx, g, limits); err != nil {
		t.Fatalf("prepare once the unrecorded daemon answers: %v", err)
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 1 || got[0] == orphan {
		t.Errorf("daemons of group %s: %v (the unrecorded one was %d), want one, started by the plugin", g.Name, got, orphan)
	}
}
