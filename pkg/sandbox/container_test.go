package sandbox

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestContainerIsWhatRuncBuilds runs the lister, as root, in the sandbox
// of a plain container and reads what it finds: its own PID namespace
// (it is PID 1 and /proc lists no process of the host), /sys read-only,
// each device node a runtime makes, working, ptys from a devpts of its
// own, a /dev/shm of a runtime's size, and a glibc base image; and
// nothing else of the host.
func TestContainerIsWhatRuncBuilds(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := enter(t, root, nil, nil)
	if err != nil {
		t.Fatalf("sandbox: %v %s", err, err.(*exec.ExitError).Stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		"pid 1",
		"proc self 1: ok",
		"proc pids [1]: ok",
		"d rw /proc",
		"d ro /sys",
		"fs /dev tmpfs 67108864",
		"fs /dev/shm tmpfs 67108864",
		"c 1:3 /dev/null",
		"c 1:5 /dev/zero",
		"c 1:7 /dev/full",
		"c 1:8 /dev/random",
		"c 1:9 /dev/urandom",
		"c 5:0 /dev/tty",
		"c 5:2 /dev/pts/ptmx",
		"l /dev/ptmx",
		"l /dev/fd",
		"l /dev/stdin",
		"write /dev/null: ok",
		"write /dev/full: no space left on device",
		"read /dev/zero 16 bytes, 16 zero: ok",
		"pty /dev/pts/0",
		"f rw /etc/passwd",
		"f rw /etc/group",
		"f ro /probe",
		"d rw /tmp",
	}
	for _, lib := range BaseLibraries {
		want = append(want, "f ro "+findLibrary(lib))
	}
	f, err := elf.Open(findLibrary("libc.so.6"))
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, "f ro "+interpreter(f))
	_ = f.Close()
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("the sandbox lacks %q", w)
		}
	}
	for _, prefix := range []string{"fs /proc proc ", "fs /sys sysfs ", "fs /dev/pts devpts ", "read /dev/random 16 bytes", "read /dev/urandom 16 bytes"} {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) }) {
			t.Errorf("the sandbox lacks a line %q...", prefix)
		}
	}
	// What is not a directory is the config's, or the kernel's.
	cfg, err := Container(buildLister(t))
	if err != nil {
		t.Fatal(err)
	}
	targets := append(cfg.Targets(), "/dev/pts/ptmx")
	for _, l := range lines {
		kind, path, _ := strings.Cut(l, " ")
		if kind != "f" && kind != "c" && kind != "l" {
			continue
		}
		path = path[strings.LastIndex(path, " ")+1:]
		if !slices.Contains(targets, path) {
			t.Errorf("the sandbox shows %q, which is none of its config's %v", l, targets)
		}
	}
	if t.Failed() {
		t.Logf("the sandbox showed:\n%s", out)
	}
}

// TestEnterNeedsItsOwnPIDNamespace: a first stage that is not the init of
// a PID namespace would mount a /proc that shows the host's processes; it
// refuses to build the sandbox instead.
func TestEnterNeedsItsOwnPIDNamespace(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := Container(buildLister(t))
	if err != nil {
		t.Fatal(err)
	}
	out, err := enterConfig(t, root, cfg, syscall.CLONE_NEWNS)
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 || !strings.Contains(string(ee.Stderr), "not the init of a PID namespace of its own: the sandbox needs its own mount and PID namespaces") {
		t.Errorf("sandbox without a PID namespace: %v, want it refused; it showed:\n%s", err, out)
	}
}

// TestEnterMakesOnlyAContainersFileSystems: a mount is of a file system a
// runtime makes a container, never of a device or a host directory.
func TestEnterMakesOnlyAContainersFileSystems(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := Container(buildLister(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Mounts = append(cfg.Mounts, Mount{Type: "ext4", Target: "/mnt"})
	out, err := enterConfig(t, root, cfg, syscall.CLONE_NEWNS|syscall.CLONE_NEWPID)
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != ExitRefused || !strings.Contains(string(ee.Stderr), `ext4 at /mnt: refused: file system type "ext4" is none of [proc sysfs tmpfs devpts]`) {
		t.Errorf("sandbox with an ext4 mount: %v, want it refused; it showed:\n%s", err, out)
	}
}
