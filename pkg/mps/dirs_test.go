package mps_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// A daemon stopped while claims hold its group (its GPU was lost) and
// started again (the GPU came back) listens where the containers of those
// claims look: their bind mounts hold the pipe directory's inode, so the
// directory is kept, not made anew. An open descriptor of the directory
// stands in for a container's bind mount.
func TestADaemonStartedAgainListensInTheSamePipeDirectory(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	limits := mps.Share(1, 4, []int64{40960})
	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	pipe := filepath.Join(root, g.Name, mps.PipeDir)
	mounted, err := os.Open(pipe)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mounted.Close() }()
	inContainer := filepath.Join("/proc", strconv.Itoa(os.Getpid()), "fd", strconv.Itoa(int(mounted.Fd())))

	if err := m.Halt(ctx, g); err != nil {
		t.Fatalf("stop for a lost GPU: %v", err)
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 0 {
		t.Fatalf("daemons %v after the stop", got)
	}
	if md.get("GPU-a") {
		t.Error("the lost GPU stays EXCLUSIVE_PROCESS after its daemon stopped")
	}
	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatalf("start again: %v", err)
	}
	var before, after syscall.Stat_t
	if err := syscall.Fstat(int(mounted.Fd()), &before); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(pipe, &after); err != nil {
		t.Fatal(err)
	}
	if before.Ino != after.Ino || before.Dev != after.Dev {
		t.Errorf("the pipe directory was made anew (inode %d, was %d): containers that mount the old one cannot reach the new daemon", after.Ino, before.Ino)
	}
	if got := mpstest.Join(t, control, inContainer, "", ""); got != "thread=25 mem=0=10240M" {
		t.Errorf("a client through the directory the containers hold got %q", got)
	}
}

// Links planted where the plugin makes its directories are refused, not
// followed: the link's target keeps its mode and gets no tmpfs.
func TestALinkPlantedForTheShmDirectoryIsRefused(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control, func(o *mps.Options) { o.ShmTmpfsMiB = 1 })
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	target := t.TempDir()
	if err := os.Chmod(target, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(target, 0) })
	if err := os.MkdirAll(filepath.Join(root, g.Name), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, g.Name, mps.ShmDir)
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}

	err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960})))
	if err == nil || !strings.Contains(err.Error(), link+" is not a directory but a symbolic link") {
		t.Errorf("start with a link planted as the shm directory: %v, want a refusal naming it", err)
	}
	fi, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 || fi.Mode()&os.ModeSticky != 0 {
		t.Errorf("the link's target has mode %v, want 0700 as it was", fi.Mode())
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == target {
			t.Errorf("something is mounted on the link's target: %s", line)
		}
	}
	if md.get("GPU-a") {
		t.Error("the GPU is EXCLUSIVE_PROCESS after a refused start")
	}

	// The same root with the link gone: the shm directory is made and
	// gets its tmpfs, which the stop takes away again.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(link, 0) })
	var shm, dir syscall.Stat_t
	if err := syscall.Lstat(link, &shm); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Lstat(filepath.Dir(link), &dir); err != nil {
		t.Fatal(err)
	}
	if shm.Dev == dir.Dev || shm.Mode&0o7777 != 0o1777 {
		t.Errorf("the shm directory: device %d (its parent's %d), mode %o; want a tmpfs of its own, 1777", shm.Dev, dir.Dev, shm.Mode&0o7777)
	}
	if err := m.Settle(ctx, g, mps.Unused()); err != nil {
		t.Fatal(err)
	}
}

// Containers get the pipe directory read-only: MPS clients only connect
// to the daemon's sockets, which a read-only bind mount allows (connect
// checks write permission on the socket's inode, and a read-only mount
// refuses writes to regular files, directories and links only), while
// a container's root can neither remove nor replace the socket. Run in a
// mount namespace of its own, as a container's mounts are.
func TestClientsJoinThroughAReadOnlyPipeDirectory(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, _, root := tenantManager(t, control)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(t.TempDir(), "nvidia-mps")
	script := `set -u
mount --make-rprivate /
mkdir -p "$IN"
mount --bind "$PIPE" "$IN"
mount -o remount,bind,ro "$IN"
rm -f "$IN/control" 2>/dev/null && echo REMOVED
ln -sf /elsewhere "$IN/control" 2>/dev/null && echo REPLACED
touch "$IN/planted" 2>/dev/null && echo PLANTED
CUDA_MPS_PIPE_DIRECTORY="$IN" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 "$CONTROL" --client
`
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IN=" + inside, "PIPE=" + filepath.Join(root, g.Name, mps.PipeDir), "CONTROL=" + control}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("a client in a mount namespace with the pipe directory read-only: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "thread=25 mem=0=10240M" {
		t.Errorf("in the container: %q, want the client's share and nothing removed, replaced or planted", got)
	}
}
