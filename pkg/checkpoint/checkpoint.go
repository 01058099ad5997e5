// Package checkpoint is the plugin's memory across restarts: which claim
// holds which seats, with which generations, and how far each prepare got.
// It is the source of truth for prepared claims; CDI specs are derived from
// it and re-created from it after a reboot empties the CDI directory.
//
// On disk it is one JSON file under the plugin's data directory:
//
//	{"version": "v1", "checksum": "sha256:<hex of compact data>", "data": {...}}
//
// The checksum covers the bytes of data as stored (in compact form), not a
// re-encoding of the decoded struct, so a newer plugin whose types grew a
// field still verifies an older file. Writes are atomic (temp file,
// rename), and the previous good file is kept beside it as a fallback
// against corruption. A save is safe against the plugin crashing the moment
// it returns (the page cache outlives the process); Sync makes it durable
// against the node losing power, which callers do behind the save, off the
// path of the call that needed it (see the plugin's design notes).
//
// Compatibility rule: a plugin reads its own version and every older one
// (converting on read) and writes its own; it refuses to overwrite a file
// of a newer version, so a rollback never silently drops state it cannot
// read.
package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// Version is the format this plugin writes.
const Version = "v1"

// FileName is the checkpoint's file name in the plugin data directory.
const FileName = "checkpoint.json"

// Phase is how far a claim's prepare got.
type Phase string

const (
	// PrepareStarted: seats are chosen and recorded, the CDI spec may not
	// be written yet and the kubelet has no answer. Earlier plugins wrote
	// it; a later prepare completes it with the same seats, an unprepare
	// releases them.
	PrepareStarted Phase = "PrepareStarted"
	// PrepareCompleted: the claim holds its seats and its CDI spec is owed:
	// written by the prepare that recorded it, or again by a repeated
	// prepare or the next start when it is missing.
	PrepareCompleted Phase = "PrepareCompleted"
)

// State is everything the checkpoint holds.
type State struct {
	// BootID is the boot the state was last written in; a change means the
	// node rebooted and the CDI directory (tmpfs) is empty.
	BootID string `json:"bootID,omitempty"`
	// Claims are the prepared (or being prepared) claims by UID.
	Claims map[types.UID]*Claim `json:"claims"`
	// Generations counts, per seat ("<device>/<seat>"), how often the seat
	// was handed out. It outlives the claims, so that the next holder of a
	// seat always sees a new generation.
	Generations map[string]int64 `json:"generations"`
	// GenerationFloor is set when the state was rebuilt after a loss: every
	// seat's next generation is above it, so that no generation handed out
	// before the loss can repeat.
	GenerationFloor int64 `json:"generationFloor,omitempty"`
}

// Claim is one prepared claim.
type Claim struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Phase     Phase    `json:"phase"`
	Devices   []Device `json:"devices"`
	// StatusWritten says the claim's status holds its seats. It is kept
	// with the next save after the write, so a restart may write a status
	// again, never miss one.
	StatusWritten bool `json:"statusWritten,omitempty"`
}

// Device is one allocation result of a claim and the seats it holds.
type Device struct {
	// Requests are the claim's requests this device serves.
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	// ShareID is the allocation's share of a shared device.
	ShareID string `json:"shareID,omitempty"`
	// GroupDevice is the group's shared device name (such as g01-2x): the
	// space seats are counted in, whichever layout Device was published in.
	GroupDevice string `json:"groupDevice"`
	// SeatStatus is the group, its GPUs, and the seats the device holds
	// with their generations: what the claim's status says of the device.
	v1alpha1.SeatStatus `json:",inline"`
	// CDIDevice is the device's name in the claim's CDI spec.
	CDIDevice string `json:"cdiDevice"`
	// VisibleDevices is the claim's configured naming of GPUs (uuid, index).
	VisibleDevices string `json:"visibleDevices,omitempty"`
}

// New returns an empty state.
func New() *State {
	return &State{Claims: map[types.UID]*Claim{}, Generations: map[string]int64{}}
}

type envelope struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// ErrCorrupt says a checkpoint file failed its checksum or did not parse.
var ErrCorrupt = errors.New("checkpoint is corrupt")

// ErrNewerVersion says a checkpoint was written by a newer plugin.
var ErrNewerVersion = errors.New("checkpoint was written by a newer plugin")

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
// the open file, so that it describes exactly the bytes read.
func readFileStamped(path string) (*State, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	raw, err := io.ReadAll(f)
	if err != nil {
		return nil, nil, err
	}
	st, err := Decode(raw, path)
	return st, fi, err
}

// Decode parses and verifies checkpoint bytes; name is used in errors.
func Decode(raw []byte, name string) (*State, error) {
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
	}
	if env.Version == "" || len(env.Data) == 0 {
		return nil, fmt.Errorf("%w: %s: no version or no data", ErrCorrupt, name)
	}
	// The file is indented for people; the checksum covers the compact
	// form, which indentation does not change.
	var compact bytes.Buffer
	if err := json.Compact(&compact, env.Data); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
	}
	if got := checksum(compact.Bytes()); got != env.Checksum {
		return nil, fmt.Errorf("%w: %s: checksum %s does not match its data (%s)", ErrCorrupt, name, env.Checksum, got)
	}
	st, err := convert(env.Version, env.Data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return st, nil
}

// convert reads data written in version into the current State.
func convert(version string, data []byte) (*State, error) {
	switch version {
	case Version:
		st := New()
		if err := json.Unmarshal(data, st); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if st.Claims == nil {
			st.Claims = map[types.UID]*Claim{}
		}
		if st.Generations == nil {
			st.Generations = map[string]int64{}
		}
		return st, st.check()
	default:
		return nil, fmt.Errorf("%w: version %q (this plugin writes %s); refusing to touch it", ErrNewerVersion, version, Version)
	}
}

// check rejects states no plugin writes: a decoded file whose checksum
// matched but whose content contradicts itself was written by a bug.
func (st *State) check() error {
	for uid, c := range st.Claims {
		if c == nil {
			return fmt.Errorf("%w: claim %s has no entry", ErrCorrupt, uid)
		}
		for _, d := range c.Devices {
			if len(d.Seats) != len(d.Generations) {
				return fmt.Errorf("%w: claim %s device %s has %d seats but %d generations", ErrCorrupt, uid, d.Device, len(d.Seats), len(d.Generations))
			}
		}
	}
	return nil
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Encode serialises a state into checkpoint bytes: one line, the data
// as it was checksummed. (Indenting it for people cost more than the rest
// of a save; jq shows it as well.) Files written indented by earlier
// versions decode the same.
func Encode(st *State) ([]byte, error) {
	data, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	head, err := json.Marshal(struct {
		Version  string `json:"version"`
		Checksum string `json:"checksum"`
	}{Version, checksum(data)})
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	// {"version":…,"checksum":…,"data":<data>}
	out := make([]byte, 0, len(head)+len(data)+10)
	out = append(out, head[:len(head)-1]...)
	out = append(out, `,"data":`...)
	out = append(out, data...)
	out = append(out, "}\n"...)
	return out, nil
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
			var env envelope
			if json.Unmarshal(cur, &env) == nil && env.Version != "" && env.Version != Version {
				if _, err := convert(env.Version, env.Data); errors.Is(err, ErrNewerVersion) {
					return fmt.Errorf("save checkpoint: %w", err)
				}
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
