package mps_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// The tests mount real tmpfs file systems (they run as root, as the
// plugin does) and read back what the kernel made of them.

func statfs(t *testing.T, dir string) unix.Statfs_t {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// fill writes into a new file in dir until a write fails, and returns
// the bytes written and the error.
func fill(t *testing.T, dir string, most int64) (int64, error) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "tenant-data"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	chunk := make([]byte, 64<<10)
	var n int64
	for n < most {
		w, err := f.Write(chunk)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Each group's clients get a tmpfs of its own as their /dev/shm: of the
// default size unless told otherwise, and full at its size, where a write
// fails with ENOSPC and the host's disk is untouched. The simulated
// daemon serves its clients over it.
func TestEachGroupsShmIsATmpfsOfItsOwnSize(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, _, root := tenantManager(t, control)
	small, _, smallRoot := tenantManager(t, control, func(o *mps.Options) { o.ShmTmpfsMiB = 2 })
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	h := mps.Group{Name: "g1-1x", UUIDs: []string{"GPU-b"}}
	t.Cleanup(func() {
		_ = m.Settle(context.Background(), g, mps.Unused())
		_ = small.Settle(context.Background(), h, mps.Unused())
	})
	limits := mps.Share(1, 4, []int64{40960})
	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	if err := small.Ensure(ctx, h, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}

	shm := filepath.Join(root, g.Name, mps.ShmDir)
	st := statfs(t, shm)
	if st.Type != unix.TMPFS_MAGIC || st.Blocks*uint64(st.Bsize) != mps.DefaultShmTmpfsMiB<<20 {
		t.Errorf("the shm directory by default: file system %#x of %d bytes, want a tmpfs (%#x) of %d MiB", st.Type, st.Blocks*uint64(st.Bsize), unix.TMPFS_MAGIC, mps.DefaultShmTmpfsMiB)
	}
	if got := mpstest.Join(t, control, filepath.Join(root, g.Name, mps.PipeDir), "", ""); got != "thread=25 mem=0=10240M" {
		t.Errorf("a client of the daemon over its tmpfs got %q", got)
	}

	smallShm := filepath.Join(smallRoot, h.Name, mps.ShmDir)
	if st := statfs(t, smallShm); st.Type != unix.TMPFS_MAGIC || st.Blocks*uint64(st.Bsize) != 2<<20 {
		t.Errorf("a shm directory of 2 MiB: file system %#x of %d bytes", st.Type, st.Blocks*uint64(st.Bsize))
	}
	n, err := fill(t, smallShm, 64<<20)
	if !errors.Is(err, syscall.ENOSPC) || n > 2<<20 || n < 2<<20-64<<10 {
		t.Errorf("a tenant writing 64 MiB into a 2 MiB shm directory: %d bytes, then %v; want ENOSPC at 2 MiB", n, err)
	}
	if st := statfs(t, shm); st.Bfree != st.Blocks {
		t.Errorf("another group's shm directory has %d of %d blocks free after a tenant filled its own", st.Bfree, st.Blocks)
	}
}

// The tmpfs lives as long as the group's directory: a plugin started
// again adopts the daemon and mounts nothing over it; a daemon stopped
// for a lost GPU keeps it for the containers that mount it, and one
// started again there gets the same tmpfs back, with what clients wrote
// in it; the group's last release unmounts it, also where the options
// now ask for plain directories. Nothing stays mounted.
func TestTheShmTmpfsLivesAsLongAsTheGroupsDirectory(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, _, root := tenantManager(t, control)
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	killDaemonsAtEnd(t, control, root, g.Name)
	limits := mps.Share(1, 4, []int64{40960})
	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	shm := filepath.Join(root, g.Name, mps.ShmDir)
	if err := os.WriteFile(filepath.Join(shm, "segment"), []byte("a client's"), 0o644); err != nil {
		t.Fatal(err)
	}
	var first unix.Stat_t
	if err := unix.Stat(shm, &first); err != nil {
		t.Fatal(err)
	}
	sameTmpfs := func(when string) {
		t.Helper()
		if got := mpstest.Mounts(t, root); !slices.Equal(got, []string{shm}) {
			t.Errorf("%s: mounts under the root %v, want the one tmpfs on %s", when, got, shm)
		}
		var st unix.Stat_t
		if err := unix.Stat(shm, &st); err != nil || st.Dev != first.Dev {
			t.Errorf("%s: the shm directory is on device %d (%v), want the first tmpfs's %d", when, st.Dev, err, first.Dev)
		}
		if data, err := os.ReadFile(filepath.Join(shm, "segment")); err != nil || string(data) != "a client's" {
			t.Errorf("%s: what a client wrote in the shm directory: %q, %v", when, data, err)
		}
	}

	restarted, _ := managerOn(t, control, root)
	if err := restarted.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	sameTmpfs("adopted by a plugin started again")
	if err := restarted.Halt(ctx, g); err != nil {
		t.Fatal(err)
	}
	sameTmpfs("the daemon stopped for a lost GPU")
	if err := restarted.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	sameTmpfs("the daemon started again for the GPU back")

	unbounded, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: (&modes{exclusive: map[string]bool{}}).set, ShmUnbounded: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := unbounded.Settle(ctx, g, mps.Unused()); err != nil {
		t.Fatalf("the group's last release, by a plugin now asked for plain directories: %v", err)
	}
	if got := mpstest.Mounts(t, root); len(got) != 0 {
		t.Errorf("mounts left under the root after the group's last release: %v", got)
	}
	if _, err := os.Lstat(filepath.Join(root, g.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the group's directory after its last release: %v, want it removed", err)
	}
}

// A size of 0 does not stand for a default, nor for unbounded: only
// ShmUnbounded asks for a plain directory, and then without a size.
func TestAShmSizeOfZeroIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mib       int64
		unbounded bool
		wantErr   string
	}{
		{"zero", 0, false, "mps: ShmTmpfsMiB is 0, which would leave each daemon's shm directory unbounded on the host's disk: give a size, or set ShmUnbounded to mean it"},
		{"negative", -64, false, "mps: ShmTmpfsMiB -64 is negative"},
		{"a size and unbounded", 64, true, "mps: ShmTmpfsMiB 64 and ShmUnbounded contradict each other"},
		{"a size", 64, false, ""},
		{"unbounded", 0, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mps.NewManager(mps.Options{Root: t.TempDir(), Control: []string{"true"}, SetExclusive: (&modes{exclusive: map[string]bool{}}).set,
				ShmTmpfsMiB: tc.mib, ShmUnbounded: tc.unbounded})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("NewManager: %v, want it accepted", err)
			case tc.wantErr != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.wantErr)):
				t.Errorf("NewManager: %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// Asked for plain directories, the group's shm is one, on the root's file
// system.
func TestAnUnboundedShmIsAPlainDirectory(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, _, root := tenantManager(t, control, func(o *mps.Options) { o.ShmTmpfsMiB, o.ShmUnbounded = 0, true })
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); err != nil {
		t.Fatal(err)
	}
	if got := mpstest.Mounts(t, root); len(got) != 0 {
		t.Errorf("mounts under the root with unbounded shm directories: %v", got)
	}
	if st := statfs(t, filepath.Join(root, g.Name, mps.ShmDir)); st.Type != statfs(t, root).Type {
		t.Errorf("the unbounded shm directory is on file system %#x, not the root's", st.Type)
	}
}

// A plugin that may not mount (no CAP_SYS_ADMIN: not root, or a container
// that is not privileged) says so at start and fails each daemon's start
// with the reason and the way out; it never gives the group a plain
// directory instead. The capability is dropped from this test's thread
// alone (capabilities are per thread), where the daemon's start mounts.
func TestWithoutTheRightToMountADaemonDoesNotStart(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	m, md, root := tenantManager(t, control)
	plain, _, _ := tenantManager(t, control, func(o *mps.Options) { o.ShmTmpfsMiB, o.ShmUnbounded = 0, true })
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	limits := mps.Share(1, 4, []int64{40960})

	var checkErr, ensureErr, plainErr error
	withoutCapSysAdmin(t, func() {
		checkErr = m.CheckShm()
		ensureErr = m.Ensure(ctx, g, mps.Fixed(limits))
		plainErr = plain.CheckShm()
	})
	for what, err := range map[string]error{"CheckShm": checkErr, "the daemon's start": ensureErr} {
		if err == nil || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") || !strings.Contains(err.Error(), `(unbounded)`) {
			t.Errorf("%s without CAP_SYS_ADMIN: %v, want the reason and the way out", what, err)
		}
	}
	if plainErr != nil {
		t.Errorf("CheckShm of plain directories without CAP_SYS_ADMIN: %v", plainErr)
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 0 {
		t.Errorf("daemons %v run with an shm directory that could not be mounted", got)
	}
	if md.get("GPU-a") {
		t.Error("the GPU is EXCLUSIVE_PROCESS after a start that failed")
	}
	if got := mpstest.Mounts(t, root); len(got) != 0 {
		t.Errorf("mounts under the root: %v", got)
	}

	// With the capability, the same group starts, over its tmpfs.
	if err := m.CheckShm(); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	if st := statfs(t, filepath.Join(root, g.Name, mps.ShmDir)); st.Type != unix.TMPFS_MAGIC {
		t.Errorf("the shm directory is on file system %#x, want a tmpfs", st.Type)
	}
}

// withoutCapSysAdmin runs f on this goroutine's thread with CAP_SYS_ADMIN
// out of the thread's effective set, and puts it back after. A thread
// that cannot get it back is not reused: the goroutine ends locked to it.
func withoutCapSysAdmin(t *testing.T, f func()) {
	t.Helper()
	runtime.LockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		t.Fatal(err)
	}
	if caps[0].Effective&(1<<unix.CAP_SYS_ADMIN) == 0 {
		t.Fatal("the test runs without CAP_SYS_ADMIN: it needs root, as the plugin does")
	}
	dropped := caps
	dropped[0].Effective &^= 1 << unix.CAP_SYS_ADMIN
	if err := unix.Capset(&hdr, &dropped[0]); err != nil {
		t.Fatal(err)
	}
	f()
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		t.Fatalf("give the test's thread CAP_SYS_ADMIN back: %v", err)
	}
	runtime.UnlockOSThread()
}
