package mps

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The MPS root is checked once, when the Manager is made, and from then on
// used as the directory opened then: records, locks, the daemons'
// directories and their removal all go through that descriptor, never
// through the root's path looked up again. The daemons and the containers'
// bind mounts still get paths (MPS knows no other way), so the path must
// keep leading where it led at the check:
//
//   - the root is a directory of the plugin's user that no one else may
//     write in, and not a symbolic link (a link could be pointed
//     elsewhere by whoever owns it, or writes in the directory holding
//     it);
//   - every directory and link the kernel walks through to reach it
//     (links resolved, as the kernel does) belongs to root or the plugin's
//     user, and every such directory is writable by no one else, unless
//     it is sticky, as /tmp is: in a sticky directory only an entry's
//     owner, root or the plugin's user here, may rename or remove it.
//
// This is sshd's StrictModes, applied to the walk rather than the
// resolved path alone: a link on the way counts, and so does the
// directory that holds it. The root itself must not be sticky-writable:
// others could plant the daemons' directories there.

// maxLinks bounds the links followed in one walk, as the kernel's ELOOP does.
const maxLinks = 40

// checkRoot makes the root if it is missing and checks it and the way to
// it (above). It returns the root's identity, so that the directory
// opened after can be checked to be the one checked.
func checkRoot(root string) (*unix.Stat_t, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("create the MPS directory: %w", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("the MPS directory %s: %w", root, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(abs, &st); err != nil {
		return nil, fmt.Errorf("the MPS directory %s: %w", root, err)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, fmt.Errorf("the MPS directory %s is a symbolic link: give the directory it leads to, so that no one can point it elsewhere", root)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return nil, fmt.Errorf("the MPS directory %s is not a directory", root)
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("the MPS directory %s belongs to user %d, not to the plugin's user %d", root, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return nil, fmt.Errorf("others than its owner may write in the MPS directory %s (mode %o): they could plant the directories the plugin gives to containers", root, st.Mode&0o7777)
	}
	walked, err := walkTo(abs)
	if err != nil {
		return nil, fmt.Errorf("the MPS directory %s: %w", root, err)
	}
	if walked.Dev != st.Dev || walked.Ino != st.Ino {
		return nil, fmt.Errorf("the MPS directory %s changed while it was checked", root)
	}
	return &st, nil
}

// walkTo walks the absolute, clean path of a directory (not a link) one
// entry at a time, as the kernel would, checks each entry on the way and
// returns the status of the last.
func walkTo(path string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat("/", &st); err != nil {
		return nil, fmt.Errorf("stat /: %w", err)
	}
	if err := checkWalked("/", &st); err != nil {
		return nil, err
	}
	todo := strings.Split(path, "/")
	cur, links := "/", 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			// cur has no links in it, so its parent is the kernel's "..".
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		if err := unix.Lstat(next, &st); err != nil {
			return nil, fmt.Errorf("stat %s: %w", next, err)
		}
		if err := checkWalked(next, &st); err != nil {
			return nil, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			cur = next
			continue
		case unix.S_IFLNK:
		default:
			return nil, fmt.Errorf("%s is not a directory", next)
		}
		if links++; links > maxLinks {
			return nil, fmt.Errorf("%s: too many levels of symbolic links", path)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return nil, fmt.Errorf("read the link %s: %w", next, err)
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	// The path's own last entry is a directory, so the walk ends on it.
	if err := unix.Lstat(cur, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", cur, err)
	}
	return &st, nil
}

// checkWalked checks an entry on the way to the root: owned by root or the
// plugin's user, and, for a directory, writable by no one else unless
// sticky.
func checkWalked(path string, st *unix.Stat_t) error {
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s, on the way to it, belongs to user %d: only root or the plugin's user may own what leads to the MPS directory, or they could point it elsewhere", path, st.Uid)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return fmt.Errorf("%s, on the way to it, is writable by others than its owner (mode %o) and not sticky: they could replace what leads to the MPS directory", path, st.Mode&0o7777)
	}
	return nil
}

// openRoot opens the root checked as want, and fails if what it opens is
// not that directory (replaced between the check and the open).
func openRoot(path string, want *unix.Stat_t) (*os.Root, *os.File, error) {
	r, err := os.OpenRoot(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open the MPS directory: %w", err)
	}
	dir, err := r.Open(".")
	if err != nil {
		_ = r.Close()
		return nil, nil, fmt.Errorf("open the MPS directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(dir.Fd()), &st); err != nil || st.Dev != want.Dev || st.Ino != want.Ino {
		_ = dir.Close()
		_ = r.Close()
		return nil, nil, fmt.Errorf("the MPS directory %s changed while it was checked (%v)", path, err)
	}
	return r, dir, nil
}
