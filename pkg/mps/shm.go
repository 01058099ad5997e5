package mps

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// makeShm makes a daemon's shm directory, which its clients get as their
// /dev/shm: the daemon and its clients exchange shared memory there. A
// tmpfs of its own keeps one group's clients from filling another's, and
// the host's disk.
func (m *Manager) makeShm(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	// Any user ID in a container may need it, as in /dev/shm.
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		return err
	}
	if m.opts.ShmTmpfsMiB == 0 {
		return nil
	}
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) == nil && unix.Stat(dir+"/..", &parent) == nil && st.Dev != parent.Dev {
		return nil // mounted already, by an earlier start
	}
	opts := fmt.Sprintf("size=%dm,mode=1777", m.opts.ShmTmpfsMiB)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
	}
	klog.FromContext(ctx).V(2).Info("Mounted the MPS shm directory", "dir", dir, "options", opts)
	return nil
}

func (m *Manager) removeShm(ctx context.Context, dir string) {
	if m.opts.ShmTmpfsMiB == 0 {
		return
	}
	if err := unix.Unmount(dir, 0); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		klog.FromContext(ctx).Error(err, "Cannot unmount the MPS shm directory", "dir", dir)
	}
}
