package mps

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The MPS root and each daemon's directory are the plugin's alone; the
// pipe and shm directories below are bind-mounted into containers, whose
// processes may be root. Nothing is created, changed or mounted through a
// path that could lead elsewhere: each directory is made with mkdirat,
// opened with O_NOFOLLOW relative to its parent, checked to be a
// directory the plugin owns, and changed through that descriptor (fchmod,
// a mount on /proc/self/fd/N). A link or anything else planted where a
// directory belongs is refused with an error naming it, never followed.

// makeDir makes (or finds) the directory name in parent, with mode, and
// returns it open. What is there already must be a directory of the
// plugin's user, not a link: anything else is refused.
func makeDir(parent *os.File, name string, mode os.FileMode) (*os.File, error) {
	path := filepath.Join(parent.Name(), name)
	err := unix.Mkdirat(int(parent.Fd()), name, uint32(mode.Perm()))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	f, err := openDir(parent, name)
	if err != nil {
		return nil, err
	}
	if err := setMode(f, mode); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// openDir opens the directory name in parent without following a link,
// and checks it is the plugin user's.
func openDir(parent *os.File, name string) (*os.File, error) {
	path := filepath.Join(parent.Name(), name)
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return nil, fmt.Errorf("%s is not a directory but %s: refusing to use it (something was planted there)", path, fileType(parent, name))
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if int(st.Uid) != os.Geteuid() {
		_ = f.Close()
		return nil, fmt.Errorf("%s belongs to user %d, not to the plugin's user %d: refusing to use it", path, st.Uid, os.Geteuid())
	}
	return f, nil
}

func setMode(f *os.File, mode os.FileMode) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	want := uint32(mode.Perm())
	if mode&os.ModeSticky != 0 {
		want |= unix.S_ISVTX
	}
	if st.Mode&0o7777 == want {
		return nil
	}
	if err := unix.Fchmod(int(f.Fd()), want); err != nil {
		return fmt.Errorf("chmod %s: %w", f.Name(), err)
	}
	return nil
}

func fileType(parent *os.File, name string) string {
	var st unix.Stat_t
	if err := unix.Fstatat(int(parent.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "unreadable"
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return fmt.Sprintf("a file of type %o", st.Mode&unix.S_IFMT)
}

// groupDir is a daemon's directory, Options.Root/<name>: its record, its
// GPUs (gpusFile), what its start did to their compute mode
// (computemode.go), and its pipe, log and shm directories. It is reached
// through the root as it was opened, never through its path, which only
// the daemon, its control client and the containers' mounts are given.
type groupDir struct {
	// root and parent are the MPS root, opened (Manager.root, Manager.dir).
	root   *os.Root
	parent *os.File
	name   string
	// path is the directory's host path.
	path string
}

// dirOf is the directory of the group's daemon.
func (m *Manager) dirOf(name string) groupDir {
	return groupDir{root: m.root, parent: m.dir, name: name, path: filepath.Join(m.opts.Root, name)}
}

// make makes (or finds) the daemon's directory and its pipe and log
// directories, and returns the daemon's directory open.
func (g groupDir) make() (*os.File, error) {
	dir, err := makeDir(g.parent, g.name, 0o755)
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{PipeDir, LogDir} {
		f, err := makeDir(dir, sub, 0o755)
		if err != nil {
			_ = dir.Close()
			return nil, err
		}
		_ = f.Close()
	}
	return dir, nil
}

// open opens the daemon's directory in the root (see openDir).
func (g groupDir) open() (*os.File, error) { return openDir(g.parent, g.name) }

// clearPipe removes what a daemon that ended left in its pipe directory
// (its sockets), so that the next one can bind there. Links are removed,
// not followed. dir is the daemon's directory, open.
func (g groupDir) clearPipe(dir *os.File) error {
	pipe, err := openDir(dir, PipeDir)
	if err != nil {
		return err
	}
	defer func() { _ = pipe.Close() }()
	names, err := pipe.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", pipe.Name(), err)
	}
	for _, n := range names {
		if err := g.root.RemoveAll(filepath.Join(g.name, PipeDir, n)); err != nil {
			return fmt.Errorf("clear %s: %w", pipe.Name(), err)
		}
	}
	return nil
}

// exists tells whether the daemon's directory is there (a link or file
// in its place counts, so that it is reported when used).
func (g groupDir) exists() bool {
	_, err := g.root.Lstat(g.name)
	return err == nil
}

// remove removes the daemon's directory and all below it.
func (g groupDir) remove() error { return g.root.RemoveAll(g.name) }

// readFile reads a file of the daemon's directory (gpusFile, or one of
// its log directory).
func (g groupDir) readFile(path ...string) ([]byte, error) {
	dir, err := g.open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = dir.Close() }()
	for _, sub := range path[:len(path)-1] {
		next, err := openDir(dir, sub)
		if err != nil {
			return nil, err
		}
		_ = dir.Close()
		dir = next
	}
	return readAt(dir, path[len(path)-1])
}

// gpus are the GPUs the directory records (none if there is no
// directory).
func (g groupDir) gpus() []string {
	data, err := g.readFile(gpusFile)
	if err != nil {
		return nil
	}
	return strings.Fields(string(data))
}

// openLog opens the daemon's output file, in its log directory; dir is
// the daemon's directory, open.
func openLog(dir *os.File) (*os.File, error) {
	logDir, err := openDir(dir, LogDir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logDir.Close() }()
	return openAt(logDir, "daemon.out", unix.O_CREAT|unix.O_WRONLY|unix.O_APPEND, 0o644)
}

// logTail is the end of the daemon's output and control log, for errors.
func (g groupDir) logTail() string {
	var tail []string
	for _, f := range []string{"daemon.out", "control.log"} {
		data, err := g.readFile(LogDir, f)
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		tail = append(tail, f+": "+strings.Join(lines[max(0, len(lines)-3):], " | "))
	}
	if len(tail) == 0 {
		return "the daemon logged nothing"
	}
	return strings.Join(tail, "; ")
}

// readAt reads the regular file name in dir; a link there is refused.
func readAt(dir *os.File, name string) ([]byte, error) {
	f, err := openAt(dir, name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", f.Name())
	}
	var buf bytes.Buffer
	_, err = buf.ReadFrom(f)
	return buf.Bytes(), err
}

// writeAt writes the file name in dir, replacing what it held; a link
// there is refused.
func writeAt(dir *os.File, name string, data []byte, mode uint32) error {
	f, err := openAt(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// replaceAt replaces the file name in dir atomically (a temporary file
// renamed over it): a plugin that dies halfway leaves the old file or the
// new one, never half of one.
func replaceAt(dir *os.File, name string, data []byte, mode uint32) error {
	tmp := name + ".tmp"
	if err := writeAt(dir, tmp, data, mode); err != nil {
		return err
	}
	if err := unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), name); err != nil {
		return fmt.Errorf("rename %s: %w", filepath.Join(dir.Name(), tmp), err)
	}
	return nil
}

// openAt opens name in dir without following a link there.
func openAt(dir *os.File, name string, flags int, mode uint32) (*os.File, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
