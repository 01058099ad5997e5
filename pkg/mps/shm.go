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

// A daemon's shm directory is the /dev/shm of every container of its
// group, and tenants write there. A plain directory would live on the MPS
// root's filesystem, the kubelet's, charged to no pod: one tenant could
// fill the node's disk. So it is a tmpfs of its own, ShmTmpfsMiB large:
// what the group's clients write there together is bounded, as a
// container's own /dev/shm (64 MiB by default) bounds one container's,
// and it is memory, charged to the memory cgroup of the process that
// writes it, not disk. A plain directory is had only by asking for it
// (ShmUnbounded).
//
// The tmpfs is mounted when a daemon starts and stays while the group's
// directories do: containers of the group have it mounted, and a daemon
// started again for them (after a restart of the plugin, or a lost GPU)
// must share it with them. It is unmounted when the group's directory is
// removed, whatever the options say now: a tmpfs an earlier configuration
// mounted goes too.

// DefaultShmTmpfsMiB is the size of each daemon's shm tmpfs unless set:
// the clients of a group share it as their /dev/shm, so it holds four
// containers' worth of the 64 MiB a container runtime gives each
// container's own.
const DefaultShmTmpfsMiB = 256

// ShmSizeUnbounded is how a plain shm directory, bounded by nothing but
// the free space of the MPS root's filesystem, is asked for where a size
// is given as text (a flag, a chart value).
const ShmSizeUnbounded = "unbounded"

// checkShmOptions refuses a size of 0 that does not say it means
// unbounded, and an unbounded one that gives a size.
func checkShmOptions(o Options) error {
	switch {
	case o.ShmUnbounded && o.ShmTmpfsMiB != 0:
		return fmt.Errorf("mps: ShmTmpfsMiB %d and ShmUnbounded contradict each other: give a size, or ask for plain directories", o.ShmTmpfsMiB)
	case o.ShmUnbounded:
		return nil
	case o.ShmTmpfsMiB < 0:
		return fmt.Errorf("mps: ShmTmpfsMiB %d is negative", o.ShmTmpfsMiB)
	case o.ShmTmpfsMiB == 0:
		return errors.New("mps: ShmTmpfsMiB is 0, which would leave each daemon's shm directory unbounded on the host's disk: give a size, or set ShmUnbounded to mean it")
	}
	return nil
}

// noMountHint says what to do where the plugin cannot mount.
const noMountHint = "run the plugin as root with CAP_SYS_ADMIN (the chart's mps.enabled runs it privileged), or ask for plain, unbounded shm directories (" + ShmSizeUnbounded + "), through which any tenant may fill the host's disk"

// CheckShm tells whether the daemons' shm tmpfs can be mounted: mount(2)
// needs CAP_SYS_ADMIN. Where it cannot, every start of a daemon fails,
// saying so; it never falls back to a plain directory.
func (m *Manager) CheckShm() error {
	if m.opts.ShmUnbounded {
		return nil
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("read the capabilities that mounting the MPS shm tmpfs needs: %w", err)
	}
	if caps[0].Effective&(1<<unix.CAP_SYS_ADMIN) == 0 {
		return fmt.Errorf("the MPS daemons' shm directories are tmpfs mounts of %d MiB, and this process lacks CAP_SYS_ADMIN to mount them: %s", m.opts.ShmTmpfsMiB, noMountHint)
	}
	return nil
}

// makeShm makes a daemon's shm directory and mounts its tmpfs. The mode
// and the mount go through the directory's descriptor, so a link planted
// in its place is refused, not followed.
func (d *daemon) makeShm(ctx context.Context, dir *os.File) error {
	m := d.m
	// Any user ID in a container may need it, as in /dev/shm.
	shm, err := makeDir(dir, ShmDir, 0o777|os.ModeSticky)
	if err != nil {
		return err
	}
	defer func() { _ = shm.Close() }()
	if m.opts.ShmUnbounded {
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
		// Mounted by an earlier start, and the containers of the group
		// may have it: it stays as it is.
		return nil
	}
	opts := fmt.Sprintf("size=%dm,mode=1777", m.opts.ShmTmpfsMiB)
	// The magic link of the open directory is the directory itself, not
	// a path looked up again.
	target := filepath.Join("/proc/self/fd", strconv.Itoa(int(shm.Fd())))
	if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("mount a tmpfs of %d MiB on %s: %w: %s", m.opts.ShmTmpfsMiB, shm.Name(), err, noMountHint)
		}
		return fmt.Errorf("mount a tmpfs of %d MiB on %s: %w", m.opts.ShmTmpfsMiB, shm.Name(), err)
	}
	klog.FromContext(ctx).V(2).Info("Mounted the MPS shm directory", "dir", shm.Name(), "options", opts)
	return nil
}

// maxShmMounts bounds the mounts removeShm takes off one shm directory:
// the plugin mounts one, and a second only if someone unmounted the
// first in between.
const maxShmMounts = 8

// removeShm unmounts what is mounted on the group's shm directory, through
// the group's directory as the root was opened (a path looked up again
// could lead elsewhere). A mount still in use (a file open there on the
// host) is detached: it goes from the host's view now, and from memory
// once the last user is gone.
func (g groupDir) removeShm() error {
	dir, err := g.open()
	if err != nil {
		// Not a directory of the plugin's: the plugin mounted nothing
		// in it, and its removal says what it is.
		return nil
	}
	defer func() { _ = dir.Close() }()
	// UMOUNT_NOFOLLOW: a link in the shm directory's place is not followed.
	target := filepath.Join("/proc/self/fd", strconv.Itoa(int(dir.Fd())), ShmDir)
	for range maxShmMounts {
		err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT):
			return nil // nothing (more) mounted there
		case err != nil:
			return fmt.Errorf("unmount the shm directory %s: %w", filepath.Join(dir.Name(), ShmDir), err)
		}
	}
	return fmt.Errorf("unmount the shm directory %s: still mounted after %d unmounts", filepath.Join(dir.Name(), ShmDir), maxShmMounts)
}
