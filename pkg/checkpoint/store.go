package checkpoint

import (
	"errors"
	"fmt"

	"github.com/kyb-ai/kyb-dra-driver/pkg/durablefile"
)

// Store reads and writes the checkpoint in a directory. It remembers the
// file it last read or wrote, so that a caller keeping the state in memory
// can tell whether another writer (the other plugin instance of a rolling
// update) replaced it since.
type Store struct {
	file *durablefile.File
}

// Changed reports whether the checkpoint file is no longer the one this
// store last read or wrote: another writer replaced it, or it is gone.
// Callers that share the file serialise reads and writes with a lock, so
// the answer holds until they release it.
func (s *Store) Changed() bool { return s.file.Changed() }

// NewStore returns a store for dir, which must exist.
func NewStore(dir string) *Store { return &Store{file: durablefile.New(dir, FileName)} }

// Path is the checkpoint file.
func (s *Store) Path() string { return s.file.Path() }

// LoadResult says where a loaded state came from.
type LoadResult = durablefile.Result

// Load reads the checkpoint. A corrupt file is never trusted: the previous
// good copy is used instead (and the result says so); when both are bad,
// the error wraps ErrCorrupt.
func (s *Store) Load() (*State, LoadResult, error) {
	st, res, err := durablefile.Load(s.file, Decode)
	if err == nil && res.Fresh {
		st = New()
	}
	return st, res, err
}

// Save writes the state atomically (durablefile.File.Save). Save does not
// wait for the disk; Sync does.
func (s *Store) Save(st *State) error {
	if s.file.Changed() {
		// Not the file this store wrote last: another plugin may have
		// written it, perhaps a newer one in a rollback.
		if cur, err := s.file.Read(); err == nil {
			if _, err := Decode(cur, s.Path()); errors.Is(err, ErrNewerVersion) {
				return fmt.Errorf("save checkpoint: %w", err)
			}
		}
	}
	raw, err := Encode(st)
	if err != nil {
		return err
	}
	if err := s.file.Save(raw); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

// Sync makes the last save durable: it flushes the current file and the
// directory that names it (and the previous copy) to disk, then deletes
// the copies saves put aside. A missing file is nothing to flush.
func (s *Store) Sync() error {
	if err := s.file.Sync(); err != nil {
		return fmt.Errorf("sync checkpoint: %w", err)
	}
	return nil
}

// Quarantine moves unusable checkpoint files aside, keeping them for
// diagnosis, so that a rebuilt state can be written in their place.
func (s *Store) Quarantine() error {
	_, err := s.file.Quarantine(func(raw []byte, path string) bool {
		_, err := Decode(raw, path)
		return err == nil || errors.Is(err, ErrNewerVersion)
	})
	return err
}
