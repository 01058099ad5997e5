package checkpoint

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

// Store reads and writes the checkpoint in a directory. It remembers the
// file it last read or wrote, so that a caller keeping the state in memory
// can tell whether another writer (the other plugin instance of a rolling
// update) replaced it since.
type Store struct {
	dir string

	mu sync.Mutex
	// last is the file as this store last read or wrote it.
	last fileStamp
}

// fileStamp tells one version of a file from another: every save writes a
// new file (a new inode), and a write in place changes size or mtime.
type fileStamp struct {
	dev, ino    uint64
	size, mtime int64
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(sys.Dev), sys.Ino
	}
	return st
}

func (s *Store) remember(st fileStamp) {
	s.mu.Lock()
	s.last = st
	s.mu.Unlock()
}

// Changed reports whether the checkpoint file is no longer the one this
// store last read or wrote: another writer replaced it, or it is gone.
// Callers that share the file serialise reads and writes with a lock, so
// the answer holds until they release it.
func (s *Store) Changed() bool {
	fi, err := os.Stat(s.Path())
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		return s.last != fileStamp{}
	}
	return stampOf(fi) != s.last
}

// NewStore returns a store for dir, which must exist.
func NewStore(dir string) *Store { return &Store{dir: dir} }

// Path is the checkpoint file.
func (s *Store) Path() string { return filepath.Join(s.dir, FileName) }

func (s *Store) prevPath() string { return s.Path() + ".prev" }

// LoadResult says where a loaded state came from.
type LoadResult struct {
	// Fresh is true when no checkpoint existed (first start).
	Fresh bool
	// RecoveredFrom is set when the current file was bad and the previous
	// copy was used instead; it holds the current file's problem.
	RecoveredFrom error
}

// Load reads the checkpoint. A corrupt file is never trusted: the previous
// good copy is used instead (and the result says so); when both are bad,
// the error wraps ErrCorrupt.
func (s *Store) Load() (*State, LoadResult, error) {
	s.remember(fileStamp{})
	st, fi, err := readFileStamped(s.Path())
	if err == nil {
		s.remember(stampOf(fi))
		return st, LoadResult{}, nil
	}
	if errors.Is(err, ErrNewerVersion) {
		return nil, LoadResult{}, err
	}
	currentErr := err
	if errors.Is(err, os.ErrNotExist) {
		currentErr = nil
	}
	prev, prevErr := readFile(s.prevPath())
	if errors.Is(prevErr, ErrNewerVersion) {
		// A newer plugin wrote the copy this one would fall back to: its
		// state is not this plugin's to judge, nor to overwrite.
		return nil, LoadResult{}, prevErr
	}
	switch {
	case prevErr == nil && currentErr == nil:
		// A crash between keeping the previous copy and renaming the new
		// file into place can leave only the previous copy.
		return prev, LoadResult{RecoveredFrom: fmt.Errorf("%s is missing", s.Path())}, nil
	case prevErr == nil:
		return prev, LoadResult{RecoveredFrom: currentErr}, nil
	case currentErr == nil && errors.Is(prevErr, os.ErrNotExist):
		return New(), LoadResult{Fresh: true}, nil
	case currentErr == nil:
		return nil, LoadResult{}, fmt.Errorf("%s is missing and its previous copy is unusable: %w", s.Path(), prevErr)
	default:
		return nil, LoadResult{}, fmt.Errorf("%w (previous copy: %v)", currentErr, prevErr)
	}
}

func readFile(path string) (*State, error) {
	st, _, err := readFileStamped(path)
	return st, err
}

// readFileStamped reads and decodes path, with the file's stat taken from
// the open file, so that it describes exactly the bytes read. A file that
// is there but cannot be read (a directory in its place, no permission, an
// I/O error) is as unusable as a damaged one: the error wraps ErrCorrupt,
// so that the state is recovered rather than the plugin stopped for good.
func readFileStamped(path string) (*State, os.FileInfo, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	raw, err := io.ReadAll(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	st, err := Decode(raw, path)
	return st, fi, err
}

// Save writes the state atomically: the current file becomes the previous
// copy and a new file takes its place, so that a crash at any instant
// leaves a complete file (between the renames, only the previous copy,
// which Load then uses). Save does not wait for the disk; Sync does.
//
// No rename replaces a file: the previous copy being dropped is first
// renamed aside, and Sync deletes it behind the calls. Replacing it, or
// deleting it here, frees its blocks on the call's path, which took most
// of a save's time.
func (s *Store) Save(st *State) error {
	if s.Changed() {
		// Not the file this store wrote last: another plugin may have
		// written it, perhaps a newer one in a rollback.
		if cur, err := os.ReadFile(s.Path()); err == nil {
			if _, err := Decode(cur, s.Path()); errors.Is(err, ErrNewerVersion) {
				return fmt.Errorf("save checkpoint: %w", err)
			}
		}
	}
	raw, err := Encode(st)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, FileName+".*.tmp")
	if err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return fmt.Errorf("save checkpoint: write %s: %w", tmp.Name(), err)
	}
	fi, err := tmp.Stat()
	if err != nil {
		tmp.Close()
		return fmt.Errorf("save checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	// checkpoint.json.<random>.tmp's previous copy goes aside as
	// checkpoint.json.<random>.old, a name nobody else uses.
	aside := strings.TrimSuffix(tmp.Name(), ".tmp") + ".old"
	if err := os.Rename(s.prevPath(), aside); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("save checkpoint: drop previous copy: %w", err)
	}
	if err := os.Rename(s.Path(), s.prevPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("save checkpoint: keep previous copy: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.Path()); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	s.remember(stampOf(fi))
	return nil
}

// Sync makes the last save durable: it flushes the current file and the
// directory that names it (and the previous copy) to disk, then deletes
// the copies saves put aside. A missing file is nothing to flush.
func (s *Store) Sync() error {
	f, err := os.Open(s.Path())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sync checkpoint: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync checkpoint: fsync %s: %w", s.Path(), err)
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(s.dir, FileName+".*.old"))
	if err != nil {
		return fmt.Errorf("sync checkpoint: %w", err)
	}
	for _, p := range old {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sync checkpoint: %w", err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync checkpoint: open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync checkpoint: fsync %s: %w", dir, err)
	}
	return nil
}

// Quarantine moves unusable checkpoint files aside, keeping them for
// diagnosis, so that a rebuilt state can be written in their place.
func (s *Store) Quarantine() error {
	suffix := ".corrupt-" + time.Now().UTC().Format("20060102T150405.000000000")
	for _, p := range []string{s.Path(), s.prevPath()} {
		if _, err := readFile(p); err == nil || errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrNewerVersion) {
			continue
		}
		if err := os.Rename(p, p+suffix); err != nil {
			return fmt.Errorf("set the unusable checkpoint %s aside: %w", p, err)
		}
	}
	return nil
}
