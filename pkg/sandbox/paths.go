package sandbox

// The paths the sandbox builds come from CDI specs, which the doctor reads
// as input that may be hostile: a spec may name "/../../../etc/x", and a
// host directory it binds may hold a symlink to anywhere on the host. A
// target joined to the root as a string and handed to the kernel would be
// resolved on the host, by root. So every target is resolved from a
// descriptor of the root, one component at a time, in the mount namespace
// as the earlier mounts left it (a bind of a host directory is only seen
// there), and:
//
//   - a path must be absolute and clean: no "..", no ".", no empty
//     component (CheckPath), so that it cannot climb out by name;
//   - no component may be a symlink. runc follows one inside the
//     container's root instead; we refuse it, because the sandbox's root is
//     an empty tmpfs and only a bound host directory can bring a symlink
//     into it: a spec path through one would land elsewhere than the spec
//     says, and the doctor's report says so instead of guessing;
//   - directories, mount points, device nodes, links and files are made
//     only on the sandbox's own tmpfs (its root, and the tmpfs it mounts
//     at /dev), never in a host directory bound into it, so that the
//     doctor changes nothing on the node;
//   - mounts are made on the resolved descriptor (/proc/self/fd/N, as runc
//     mounts), never on a path resolved a second time.
//
// openat2(RESOLVE_IN_ROOT) would resolve an existing path in one call, but
// the missing parts of a mount point have to be made one at a time anyway,
// and kernels before 5.6 (RHEL 8's 4.18 among them) lack it; a walk with
// openat(O_PATH|O_NOFOLLOW) works on every kernel the plugin supports.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrRefused marks a path the sandbox will not build: not clean and
// absolute, through a symlink, or outside the sandbox's own file system.
var ErrRefused = errors.New("refused")

// CheckPath says whether p may name a place in the sandbox: absolute,
// clean (no "..", ".", doubled or trailing slash) and not the root itself.
func CheckPath(p string) error {
	switch {
	case !filepath.IsAbs(p):
		return fmt.Errorf("%w: %q is not an absolute path", ErrRefused, p)
	case filepath.Clean(p) != p:
		return fmt.Errorf("%w: %q is not a clean path (no \"..\", \".\", doubled or trailing slash)", ErrRefused, p)
	case p == "/":
		return fmt.Errorf("%w: %q is the sandbox's root itself", ErrRefused, p)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("%w: %q holds a NUL byte", ErrRefused, p)
	}
	return nil
}

// rootDir is the sandbox's root, held open: every path is resolved from it.
type rootDir struct {
	fd int
	// devs are the devices of the sandbox's own file systems, the root's
	// and the tmpfs it mounted: things are made only there.
	devs []uint64
}

func openRoot(path string) (*rootDir, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open sandbox root %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("sandbox root %s: %w", path, err)
	}
	return &rootDir{fd: fd, devs: []uint64{st.Dev}}, nil
}

func (r *rootDir) Close() error { return unix.Close(r.fd) }

// maker makes the missing last component name in the directory dirfd.
type maker func(dirfd int, name string) error

func makeDir(dirfd int, name string) error { return unix.Mkdirat(dirfd, name, 0o755) }

// makeFile makes an empty file to bind a file on, following no symlink.
func makeFile(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// open resolves p in the root and returns an O_PATH descriptor of it,
// making the missing directories above it, and it with mk (nil: nothing is
// made, a missing component is an error). The caller closes the
// descriptor.
func (r *rootDir) open(p string, mk maker) (int, error) {
	dir, err := unix.Openat(r.fd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil || p == "/" {
		return dir, err
	}
	if err := CheckPath(p); err != nil {
		_ = unix.Close(dir)
		return -1, err
	}
	names := strings.Split(p[1:], "/")
	for i, name := range names {
		at := "/" + strings.Join(names[:i+1], "/")
		mkThis := mk
		if mk != nil && i < len(names)-1 {
			mkThis = makeDir
		}
		fd, err := r.step(dir, at, name, mkThis)
		_ = unix.Close(dir) // read only
		if err != nil {
			return -1, err
		}
		if i < len(names)-1 {
			if err := isDir(fd, at); err != nil {
				_ = unix.Close(fd)
				return -1, err
			}
		}
		dir = fd
	}
	return dir, nil
}

// step opens name in dir, the component of the sandbox path at, making it
// with mk when it is missing, and refuses a symlink.
func (r *rootDir) step(dir int, at, name string, mk maker) (int, error) {
	fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) && mk != nil {
		if err := r.onRoot(dir, at); err != nil {
			return -1, err
		}
		if err := mk(dir, name); err != nil {
			return -1, fmt.Errorf("make %s: %w", at, err)
		}
		fd, err = unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("%s: %w", at, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("%s: %w", at, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, unix.PathMax)
		n, _ := unix.Readlinkat(fd, "", buf)
		_ = unix.Close(fd)
		return -1, fmt.Errorf("%w: %s is a symlink (to %q) from a directory bound from the host, and the sandbox follows no symlink in a spec's path", ErrRefused, at, buf[:max(n, 0)])
	}
	return fd, nil
}

// onRoot refuses to make anything in dir unless dir is on the sandbox's
// own file system: a bound host directory is the host's.
func (r *rootDir) onRoot(dir int, at string) error {
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil {
		return fmt.Errorf("%s: %w", at, err)
	}
	if !slices.Contains(r.devs, st.Dev) {
		return fmt.Errorf("%w: %s does not exist, and its directory was bound from the host: the sandbox makes nothing outside its own file system", ErrRefused, at)
	}
	return nil
}

// own makes the file system mounted at p one of the sandbox's own.
func (r *rootDir) own(p string) error {
	fd, err := r.open(p, nil)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	r.devs = append(r.devs, st.Dev)
	return nil
}

func isDir(fd int, at string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", at, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s: %w", at, unix.ENOTDIR)
	}
	return nil
}

// parent opens the directory p is to be made in, making the missing
// directories on the way, and refuses it unless it is on the sandbox's
// own file system. The caller makes p's last component in it, where an
// existing one, a symlink included, is EEXIST; and closes it.
func (r *rootDir) parent(p string) (int, error) {
	if err := CheckPath(p); err != nil {
		return -1, err
	}
	dir, err := r.open(filepath.Dir(p), makeDir)
	if err != nil {
		return -1, err
	}
	if err := isDir(dir, filepath.Dir(p)); err != nil {
		_ = unix.Close(dir)
		return -1, err
	}
	if err := r.onRoot(dir, p); err != nil {
		_ = unix.Close(dir)
		return -1, err
	}
	return dir, nil
}

// mknod makes a character device node at p, which must not exist.
func (r *rootDir) mknod(p string, major, minor int64) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	if major < 0 || major >= 1<<12 || minor < 0 || minor >= 1<<20 {
		return fmt.Errorf("%w: device numbers %d:%d are out of range", ErrRefused, major, minor)
	}
	dir, err := r.parent(p)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(dir) }()
	return unix.Mknodat(dir, filepath.Base(p), unix.S_IFCHR|0o666, int(unix.Mkdev(uint32(major), uint32(minor))))
}

// symlink makes a symbolic link at p to target, which is not resolved:
// the link is read in the sandbox, after its root is the root.
func (r *rootDir) symlink(p, target string) error {
	dir, err := r.parent(p)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(dir) }()
	return unix.Symlinkat(target, dir, filepath.Base(p))
}

// writeFile makes a file at p holding content.
func (r *rootDir) writeFile(p, content string) error {
	dir, err := r.parent(p)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(dir) }()
	fd, err := unix.Openat(dir, filepath.Base(p), unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), p)
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// fdPath names a descriptor for the system calls that take only paths
// (mount), as runc does: the kernel resolves it to the descriptor's file,
// not by name again.
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// checkProc makes sure /proc/self/fd is procfs's, so that fdPath means the
// descriptor.
func checkProc() error {
	var st unix.Statfs_t
	if err := unix.Statfs("/proc/self/fd", &st); err != nil {
		return fmt.Errorf("the sandbox needs /proc: %w", err)
	}
	if st.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("/proc is not procfs (type %#x)", st.Type)
	}
	return nil
}
