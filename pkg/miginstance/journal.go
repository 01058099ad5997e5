package miginstance

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// The journal is a file of its own beside the seat checkpoint
// (mig-instances.json in the plugin's data directory) rather than more
// fields in it: the checkpoint's versions and the rules that let an older
// plugin read it stay as they are, and an older plugin rolled back to
// ignores the journal (it does not know MIG devices either). The seat
// checkpoint keeps the claim's seat as for any device; the journal keeps
// what NVML made for it.

// JournalFile is the journal's name in the plugin's data directory.
const JournalFile = "mig-instances.json"

// journalVersion is the journal's format.
const journalVersion = "v1"

// Phase is how far the making of an instance got.
type Phase string

const (
	// Creating is written before the first NVML call that makes anything:
	// the GPU instance at Placement may exist, and a compute instance in
	// it, or nothing at all. Once the GPU instance exists, the record says
	// so (GIMade, GI) before a compute instance is made in it: a GPU
	// instance found at the placement of a record without GIMade that
	// holds a compute instance is then not the plugin's (an
	// administrator made it after a crash before the plugin's), and is
	// left as it is.
	Creating Phase = "Creating"
	// Created is written after the compute instance exists and its MIG
	// device's UUID is read: GI, CI and UUID name it.
	Created Phase = "Created"
	// Adopted is an instance the plugin did not make (a static partition
	// that existed when the plugin started) that a claim uses: GI, CI and
	// UUID name it, and it is never destroyed, only forgotten.
	Adopted Phase = "Adopted"
)

// Record is one instance the plugin makes or made, for one device of one
// claim.
type Record struct {
	Claim types.UID `json:"claim"`
	// Device is the published device name, such as g0-mig-1g-10gb-6.
	Device  string `json:"device"`
	GPU     int    `json:"gpu"`
	GPUUUID string `json:"gpuUUID"`
	// GPUMinor is /dev/nvidiaN's N, which names the GPU in mig-minors.
	GPUMinor int `json:"gpuMinor"`
	// Profile is the GPU-instance profile's name, NVML ID and
	// NVML_GPU_INSTANCE_PROFILE_* index.
	Profile      string `json:"profile"`
	ProfileID    int    `json:"profileID"`
	ProfileIndex int    `json:"profileIndex"`
	Start        int    `json:"placementStart"`
	Size         int    `json:"placementSize"`
	Phase        Phase  `json:"phase"`
	// GIMade: a Creating record's GPU instance exists, and GI names it.
	GIMade bool `json:"giMade,omitempty"`
	// GI, CI and UUID name the instance once Created or Adopted.
	GI   int    `json:"gi,omitempty"`
	CI   int    `json:"ci,omitempty"`
	UUID string `json:"uuid,omitempty"`
}

// Placement is the record's placement.
func (r Record) Placement() mig.Placement { return mig.Placement{Start: r.Start, Size: r.Size} }

func (r Record) String() string {
	s := fmt.Sprintf("%s on GPU %d at %s for claim %s device %s (%s)", r.Profile, r.GPU, r.Placement(), r.Claim, r.Device, r.Phase)
	if r.Phase == Created || r.Phase == Adopted {
		s += fmt.Sprintf(": GI %d CI %d %s", r.GI, r.CI, r.UUID)
	}
	return s
}

// Adopted records are kept in a list of their own, which a reader that
// knows no adopted instances (an older plugin rolled back to, the doctor
// of one) ignores: to it they are instances the plugin did not make, which
// it never destroys. In records it would take one for an instance it made,
// and destroy it once its claim is released.
type journalFile struct {
	Version string   `json:"version"`
	Records []Record `json:"records"`
	Adopted []Record `json:"adopted,omitempty"`
}

// journal reads and writes the records. Writes are atomic (temp file,
// fsync, rename, fsync of the directory): a record written before an NVML
// call must survive a power loss right after it, or the call's instance
// would be nobody's.
type journal struct{ dir string }

func (j journal) path() string { return filepath.Join(j.dir, JournalFile) }

// load reads the records; a missing file has none.
func (j journal) load() ([]Record, error) {
	raw, err := os.ReadFile(j.path())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read MIG journal %s: %w", j.path(), err)
	}
	var f journalFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("read MIG journal %s: %w", j.path(), err)
	}
	if f.Version != journalVersion {
		return nil, fmt.Errorf("read MIG journal %s: version %q, this plugin reads %q", j.path(), f.Version, journalVersion)
	}
	for _, r := range f.Records {
		if r.Phase == Adopted {
			return nil, fmt.Errorf("read MIG journal %s: record %s is among the instances made", j.path(), r)
		}
	}
	for _, r := range f.Adopted {
		if r.Phase != Adopted {
			return nil, fmt.Errorf("read MIG journal %s: record %s is among the instances adopted", j.path(), r)
		}
	}
	return append(f.Records, f.Adopted...), nil
}

// save writes the records, sorted so that the file does not follow the
// order of calls.
func (j journal) save(records []Record) error {
	records = slices.Clone(records)
	slices.SortFunc(records, func(a, b Record) int {
		return strings.Compare(string(a.Claim)+"/"+a.Device, string(b.Claim)+"/"+b.Device)
	})
	f := journalFile{Version: journalVersion}
	for _, r := range records {
		if r.Phase == Adopted {
			f.Adopted = append(f.Adopted, r)
		} else {
			f.Records = append(f.Records, r)
		}
	}
	raw, err := json.Marshal(f)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(j.dir, JournalFile+".*.tmp")
	if err != nil {
		return fmt.Errorf("write MIG journal: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return fmt.Errorf("write MIG journal %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write MIG journal %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write MIG journal: %w", err)
	}
	if err := os.Rename(tmp.Name(), j.path()); err != nil {
		return fmt.Errorf("write MIG journal: %w", err)
	}
	d, err := os.Open(j.dir)
	if err != nil {
		return fmt.Errorf("write MIG journal: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write MIG journal: sync %s: %w", j.dir, err)
	}
	return nil
}

// lock takes an exclusive flock shared with the other plugin pod of a
// rolling update, which serves the same GPUs; closing the file releases
// it.
func (j journal) lock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(j.dir, JournalFile+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock MIG journal: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock MIG journal: %w", err)
	}
	return func() { _ = f.Close() }, nil
}
