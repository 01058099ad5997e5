package durablefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// File is one state file in a directory, with its previous copy beside it.
// It remembers the version of the file it last read or wrote, so that a
// caller keeping the content in memory can tell whether another writer
// (the other plugin instance of a rolling update) replaced it since.
type File struct {
	dir, name string

	mu sync.Mutex
	// last is the file as this File last read or wrote it.
	last stamp
}

// stamp tells one version of a file from another: every save writes a
// new file (a new inode), and a write in place changes size or mtime.
type stamp struct {
	dev, ino    uint64
	size, mtime int64
}

func stampOf(fi os.FileInfo) stamp {
	st := stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(sys.Dev), sys.Ino
	}
	return st
}

func (f *File) remember(st stamp) {
	f.mu.Lock()
	f.last = st
	f.mu.Unlock()
}

// New returns the file name in dir, which must exist.
func New(dir, name string) *File { return &File{dir: dir, name: name} }

// Path is the file.
func (f *File) Path() string { return filepath.Join(f.dir, f.name) }

// PrevPath is its previous copy.
func (f *File) PrevPath() string { return f.Path() + ".prev" }

// Changed reports whether the file is no longer the one last read or
// written through f: another writer replaced it, or it is gone. Callers
// that share the file serialise reads and writes with a lock, so the
// answer holds until they release it.
func (f *File) Changed() bool {
	fi, err := os.Stat(f.Path())
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		return f.last != stamp{}
	}
	return stampOf(fi) != f.last
}

// Result says where loaded content came from.
type Result struct {
	// Fresh is true when neither the file nor its previous copy exists.
	Fresh bool
	// RecoveredFrom is set when the file was unusable (or missing) and its
	// previous copy was used instead; it holds the file's problem.
	RecoveredFrom error
}

// Load reads the file with decode. A file that decode refuses is never
// trusted: the previous copy is used instead (and the result says so).
// When both are unusable the error wraps ErrCorrupt, unless decode said
// ErrNewerVersion of either: a newer program's file is not this one's to
// judge, nor to fall back from. decode's errors should wrap ErrCorrupt
// for content that is damaged; a file that is there but cannot be read
// (a directory in its place, no permission, an I/O error) is damaged.
func Load[T any](f *File, decode func(raw []byte, path string) (T, error)) (T, Result, error) {
	var zero T
	f.remember(stamp{})
	v, fi, err := readStamped(f.Path(), decode)
	if err == nil {
		f.remember(stampOf(fi))
		return v, Result{}, nil
	}
	if errors.Is(err, ErrNewerVersion) {
		return zero, Result{}, err
	}
	currentErr := err
	if errors.Is(err, os.ErrNotExist) {
		currentErr = nil
	}
	prev, _, prevErr := readStamped(f.PrevPath(), decode)
	if errors.Is(prevErr, ErrNewerVersion) {
		// A newer program wrote the copy this one would fall back to:
		// its content is not this program's to judge, nor to overwrite.
		return zero, Result{}, prevErr
	}
	switch {
	case prevErr == nil && currentErr == nil:
		// A crash between keeping the previous copy and renaming the new
		// file into place can leave only the previous copy.
		return prev, Result{RecoveredFrom: fmt.Errorf("%s is missing", f.Path())}, nil
	case prevErr == nil:
		return prev, Result{RecoveredFrom: currentErr}, nil
	case currentErr == nil && errors.Is(prevErr, os.ErrNotExist):
		return zero, Result{Fresh: true}, nil
	case currentErr == nil:
		return zero, Result{}, fmt.Errorf("%s is missing and its previous copy is unusable: %w", f.Path(), prevErr)
	default:
		return zero, Result{}, fmt.Errorf("%w (previous copy: %v)", currentErr, prevErr)
	}
}

// readStamped reads and decodes path, with the file's stat taken from the
// open file, so that it describes exactly the bytes read.
func readStamped[T any](path string, decode func([]byte, string) (T, error)) (T, os.FileInfo, error) {
	var zero T
	raw, fi, err := read(path)
	if err != nil {
		return zero, nil, err
	}
	v, err := decode(raw, path)
	return v, fi, err
}

// read reads path; a missing file is os.ErrNotExist, one that cannot be
// read is ErrCorrupt.
func read(path string) ([]byte, os.FileInfo, error) {
	fh, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	raw, err := io.ReadAll(fh)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	return raw, fi, nil
}

// Read returns the file's bytes as they are, or os.ErrNotExist.
func (f *File) Read() ([]byte, error) {
	raw, _, err := read(f.Path())
	return raw, err
}

// Save writes raw atomically: the current file becomes the previous copy
// and a new file takes its place, so that a crash at any instant leaves a
// complete file (between the renames, only the previous copy, which Load
// then uses). Save does not wait for the disk; Sync does.
//
// No rename replaces a file: the previous copy being dropped is first
// renamed aside, and Sync deletes it behind the calls. Replacing it, or
// deleting it here, frees its blocks on the call's path, which took most
// of a save's time.
func (f *File) Save(raw []byte) error {
	tmp, err := os.CreateTemp(f.dir, f.name+".*.tmp")
	if err != nil {
		return fmt.Errorf("save %s: %w", f.name, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return fmt.Errorf("save %s: write %s: %w", f.name, tmp.Name(), err)
	}
	fi, err := tmp.Stat()
	if err != nil {
		tmp.Close()
		return fmt.Errorf("save %s: %w", f.name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save %s: %w", f.name, err)
	}
	// <name>.<random>.tmp's previous copy goes aside as
	// <name>.<random>.old, a name nobody else uses.
	aside := strings.TrimSuffix(tmp.Name(), ".tmp") + ".old"
	if err := os.Rename(f.PrevPath(), aside); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("save %s: drop previous copy: %w", f.name, err)
	}
	if err := os.Rename(f.Path(), f.PrevPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("save %s: keep previous copy: %w", f.name, err)
	}
	if err := os.Rename(tmp.Name(), f.Path()); err != nil {
		return fmt.Errorf("save %s: %w", f.name, err)
	}
	f.remember(stampOf(fi))
	return nil
}

// Sync makes the last save durable: it flushes the current file and the
// directory that names it (and the previous copy) to disk, then deletes
// the copies saves put aside. A missing file is nothing to flush.
func (f *File) Sync() error {
	fh, err := os.Open(f.Path())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", f.name, err)
	}
	defer fh.Close()
	if err := fh.Sync(); err != nil {
		return fmt.Errorf("sync %s: fsync %s: %w", f.name, f.Path(), err)
	}
	if err := syncDir(f.dir); err != nil {
		return fmt.Errorf("sync %s: %w", f.name, err)
	}
	old, err := filepath.Glob(filepath.Join(f.dir, f.name+".*.old"))
	if err != nil {
		return fmt.Errorf("sync %s: %w", f.name, err)
	}
	for _, p := range old {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sync %s: %w", f.name, err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// Quarantine moves the file and its previous copy aside where keep refuses
// them (a missing one stays missing), keeping them for diagnosis, so that
// rebuilt content can be written in their place. It returns the paths
// they were moved to.
func (f *File) Quarantine(keep func(raw []byte, path string) bool) ([]string, error) {
	suffix := ".corrupt-" + time.Now().UTC().Format("20060102T150405.000000000")
	var moved []string
	for _, p := range []string{f.Path(), f.PrevPath()} {
		raw, _, err := read(p)
		if errors.Is(err, os.ErrNotExist) || err == nil && keep(raw, p) {
			continue
		}
		if err := os.Rename(p, p+suffix); err != nil {
			return moved, fmt.Errorf("set the unusable %s aside: %w", p, err)
		}
		moved = append(moved, p+suffix)
	}
	return moved, nil
}
