package mpstest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Build builds the simulated nvidia-cuda-mps-control into the test's
// temporary directory (the build cache makes it quick) and returns its
// path; the directory goes with the test.
func Build(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	cmd := exec.Command("go", "build", "-o", path, "github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest/nvidia-cuda-mps-control")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the simulated nvidia-cuda-mps-control: %v", &buildError{out: string(out), err: err})
	}
	return path
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// Commands returns the commands a daemon logged, in order.
func Commands(t testing.TB, logDir string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(logDir, "control.log"))
	if err != nil {
		t.Fatalf("read the MPS daemon's log: %v", err)
	}
	var cmds []string
	for _, line := range strings.Split(string(data), "\n") {
		if _, rest, ok := strings.Cut(line, "] cmd: "); ok {
			cmds = append(cmds, rest)
		}
	}
	return cmds
}

// LastCommand is the last of the daemon's commands that starts with
// prefix ("" for none).
func LastCommand(t testing.TB, logDir, prefix string) string {
	t.Helper()
	cmds := Commands(t, logDir)
	for _, c := range slices.Backward(cmds) {
		if strings.HasPrefix(c, prefix) {
			return c
		}
	}
	return ""
}

// Join runs a simulated CUDA process joining the daemon whose pipe
// directory is pipe, with the MPS limits of its environment (empty: none),
// and returns what the daemon gives it: "thread=<pct> mem=<limits>".
func Join(t testing.TB, control, pipe, threadPct, memLimit string) string {
	t.Helper()
	return JoinCommand(t, []string{control}, pipe, threadPct, memLimit)
}

// JoinCommand is Join with a control command that takes arguments, such
// as a simulated node's: kyb-dra-plugin mps-control-sim.
func JoinCommand(t testing.TB, control []string, pipe, threadPct, memLimit string) string {
	t.Helper()
	cmd := exec.Command(control[0], append(control[1:], "--client")...)
	cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + threadPct, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + memLimit}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("MPS client: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// Root is a directory for the daemons' pipes, logs and shm, removed with
// the test: short, under /tmp, since a pipe's socket path must fit in 108
// bytes, which a test's own temporary directory may not leave room for.
// What is still mounted in it then (the shm tmpfs of a group whose
// directory the test kept) is unmounted first.
func Root(t testing.TB) string {
	t.Helper()
	root, err := os.MkdirTemp("", "kyb-mps-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	UnmountAtEnd(t, root)
	return root
}

// Mounts lists the mount points at or under dir in this process's mount
// table, in the table's order (a mount stacked on another comes after
// it).
func Mounts(t testing.TB, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		// The fifth field is the mount point; the tests' paths have no
		// character that mountinfo escapes.
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// UnmountAtEnd unmounts, when the test ends (before the cleanups
// registered earlier, such as dir's removal), whatever is still mounted
// at or under dir.
func UnmountAtEnd(t testing.TB, dir string) {
	t.Cleanup(func() {
		for _, mp := range slices.Backward(Mounts(t, dir)) {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmount %s at the end of the test: %v", mp, err)
			}
		}
	})
}

// Daemons are the simulated daemons of the binary control that run (not
// ended, zombies excluded), by PID, each with its pipe directory: found in
// /proc, whatever the plugin recorded.
func Daemons(t testing.TB, control string) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		if exe, err := os.Readlink(filepath.Join(dir, "exe")); err != nil || exe != control {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || !slices.Contains(strings.Split(string(cmdline), "\x00"), "-f") {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(dir, "stat")); err != nil || zombie(stat) {
			continue
		}
		environ, err := os.ReadFile(filepath.Join(dir, "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(environ, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("CUDA_MPS_PIPE_DIRECTORY=")); ok {
				out[pid] = string(v)
			}
		}
	}
	return out
}

func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return true
	}
	f := strings.Fields(string(stat[i+1:]))
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

// Stop stops each process with SIGSTOP and returns once /proc shows it
// stopped: kill(2) returns before every thread of the process has
// stopped, and a daemon that still answers a command in that window is
// not the stopped daemon a test means.
func Stop(t testing.TB, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("stop PID %d: %v", pid, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for !stopped(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("PID %d is not stopped 10s after SIGSTOP", pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// stopped tells whether /proc/<pid>/stat gives the process's state as
// stopped (T).
func stopped(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'T'
}
