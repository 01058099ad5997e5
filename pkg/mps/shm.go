package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// makeShm makes a daemon's shm directory, which its clients get as their
// /dev/shm: the daemon and its clients exchange shared memory there. A
// tmpfs of its own keeps one group's clients from filling another's, and
// the host's disk. The mode and the mount go through the directory's
// descriptor, so a link planted in its place is refused, not followed.
func (m *Manager) makeShm(ctx context.Context, dir *os.File) error {
	// Any user ID in a container may need it, as in /dev/shm.
	shm, err := makeDir(dir, ShmDir, 0o777|os.ModeSticky)
	if err != nil {
		return err
	}
	defer func() { _ = shm.Close() }()
	if m.opts.ShmTmpfsMiB == 0 {
		return nil
	}
	var st, parent unix.Stat_t
	if err := unix.Fstat(int(shm.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", shm.Name(), err)
	}
	if err := unix.Fstat(int(dir.Fd()), &parent); err != nil {
		return fmt.Errorf("stat %s: %w", dir.Name(), err)
	}
	if st.Dev != parent.Dev {
		return nil // mounted already, by an earlier start
	}
	opts := fmt.Sprintf("size=%dm,mode=1777", m.opts.ShmTmpfsMiB)
	// The magic link of the open directory is the directory itself, not
	// a path looked up again.
	target := filepath.Join("/proc/self/fd", strconv.Itoa(int(shm.Fd())))
	if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", shm.Name(), err)
	}
	klog.FromContext(ctx).V(2).Info("Mounted the MPS shm directory", "dir", shm.Name(), "options", opts)
	return nil
}

func (m *Manager) removeShm(ctx context.Context, dir string) {
	if m.opts.ShmTmpfsMiB == 0 {
		return
	}
	err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		klog.FromContext(ctx).Error(err, "Cannot unmount the MPS shm directory", "dir", dir)
	}
}
