package miginstance

// The journal records what the plugin asks NVML to make, before it asks:
// a crash between two calls leaves a record of how far the making got,
// and the next start settles the GPU from it. A record must never let the
// plugin destroy what it did not make, so each says exactly what the
// interrupted step may have left, and in which boot:
//
//	(none) --check: no GPU instance at the placement (else refused)-->
//	       --journal GIIntended <GPU, profile, placement, boot>-->
//	       --CreateGpuInstanceWithPlacement, read its ID-->
//	       --journal GIMade <GI>-->
//	       --journal CIIntended <GI>-->
//	       --CreateComputeInstance (full size), read the MIG device's UUID-->
//	       --journal Created <GI, CI, UUID>--> made
//	made   --destroy the CI, then the GI; drop the record--> (none)
//
// GIMade and CIIntended are two writes with no NVML call that changes
// the GPU between them (the compute-instance profile is read): only the
// second lets a restart take a compute instance in the GPU instance for
// the plugin's, so that one is taken only after a crash that came once
// its making was announced.
//
// Every record carries the boot it was written in (package bootid). A
// reboot or a GPU reset takes every MIG instance, so a record of another
// boot is forgotten, whatever its phase, and destroys nothing: what is at
// its placement now was made after the reboot, by someone else (an
// administrator's partition made at boot has the record's GPU-instance ID,
// since IDs follow placement).
//
// Within one boot, what a record lets the next start take for the
// plugin's is what its interrupted step can have left, nothing more:
//
//	record      at the placement, of the record's profile  the plugin
//	GIIntended  no GPU instance                            forgets the record
//	            one with no compute instance               destroys it (*)
//	            one with compute instances                 leaves it: no CI is made before CIIntended
//	GIMade      the recorded GI, no compute instance       destroys it (*)
//	            the recorded GI, compute instances         leaves it: no CI is made before CIIntended
//	CIIntended  the recorded GI, no compute instance       destroys it (*)
//	            the recorded GI, one CI that spans it      destroys it (*)
//	            the recorded GI, other compute instances   leaves it: the plugin makes one, spanning the GI
//	Created     the recorded GI, CI and MIG device UUID    its instance: kept while its claim is held
//	            the recorded GI, without the recorded CI   destroys the GI if it holds no other CI (*)
//	            anything else                              forgets the record: its instance is gone
//	Adopted     anything                                   never destroys it (adopt.go)
//
// A record read from the journal's previous copy may be one write behind
// the damaged file it replaces: there a GIMade or CIIntended record whose
// GPU instance holds one compute instance spanning it is completed as
// Created instead (recover.go).
//
// (*) NVML marks no instance with its maker, and IDs follow placement, so
// nothing proves that an instance in the state the step leaves is the
// one the plugin made rather than one someone else made in the same state
// at the same placement after the plugin died and before it started again
// (seconds, within one boot, at a placement the plugin had found free and
// given to a claim of its own). The plugin takes it for its own: leaving
// it would leave every crash in that window an instance nobody owns, which
// blocks the seat for good. Beyond the step's state nothing is taken: an
// instance with a compute instance the step cannot have made is never
// touched by a half-made record, and a record of another boot touches
// nothing.
//
// A failure reported by NVML in the middle of the making is no crash: the
// plugin knows what it made, through the handles NVML returned, and rolls
// back exactly that before it drops the record.
//
// The journal is a file of its own beside the seat checkpoint
// (mig-instances.json in the plugin's data directory) rather than more
// fields in it: the checkpoint's versions and the rules that let an older
// plugin read it stay as they are. It is kept as the checkpoint is
// (package durablefile): checksums, the previous copy beside it, atomic
// writes, each flushed to disk before the NVML call it announces. A
// damaged file is recovered from its previous copy; where both are
// damaged it is rebuilt from NVML and the seat checkpoint (recover.go).
// Plugins before this format read no journal of it: they refuse it rather
// than take an instance for their own.

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

	"github.com/kyb-ai/kyb-dra-driver/pkg/durablefile"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// JournalFile is the journal's name in the plugin's data directory.
const JournalFile = "mig-instances.json"

// The journal's versions. v1 was a plain file with no checksum, its
// records with no boot (isLegacy reads it, recover.go settles its
// records); v2, v1 with adopted records among the others, is read no more.
const (
	journalV1 = "v1"
	journalV3 = "v3"
)

// journalFormat is the journal's envelope.
var journalFormat = durablefile.Format{Kind: "MIG journal", Latest: journalV3}

// Phase is how far the making of an instance got.
type Phase string

const (
	// GIIntended is written before the GPU instance is made: it may exist
	// at the placement, with no compute instance, or nothing at all.
	GIIntended Phase = "GIIntended"
	// GIMade is written once the GPU instance exists; GI names it.
	GIMade Phase = "GIMade"
	// CIIntended is written right before the compute instance is made in
	// GPU instance GI: it may exist, spanning the GPU instance.
	CIIntended Phase = "CIIntended"
	// Created is written after the compute instance exists and its MIG
	// device's UUID is read: GI, CI and UUID name it.
	Created Phase = "Created"
	// Adopted is an instance the plugin did not make (a static partition
	// that existed when the plugin started) that a claim uses: GI, CI and
	// UUID name it, and it is never destroyed, only forgotten.
	Adopted Phase = "Adopted"
)

// Made reports whether the phase names a whole instance: Created or
// Adopted.
func (p Phase) Made() bool { return p == Created || p == Adopted }

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
	// Boot is the node's boot the record was written in; empty in a v1
	// journal's records, whose boot is not known.
	Boot string `json:"boot,omitempty"`
	// GI names the GPU instance from GIMade on; CI and UUID the compute
	// instance and its MIG device once Created or Adopted.
	GI   int    `json:"gi,omitempty"`
	CI   int    `json:"ci,omitempty"`
	UUID string `json:"uuid,omitempty"`
}

// Placement is the record's placement.
func (r Record) Placement() mig.Placement { return mig.Placement{Start: r.Start, Size: r.Size} }

func (r Record) String() string {
	s := fmt.Sprintf("%s on GPU %d at %s for claim %s device %s (%s)", r.Profile, r.GPU, r.Placement(), r.Claim, r.Device, r.Phase)
	switch {
	case r.Phase.Made():
		s += fmt.Sprintf(": GI %d CI %d %s", r.GI, r.CI, r.UUID)
	case r.Phase != GIIntended:
		s += fmt.Sprintf(": GI %d", r.GI)
	}
	return s
}

// journalData is the journal's content. Adopted records are kept in a
// list of their own, as v1 kept them.
type journalData struct {
	Records []Record `json:"records"`
	Adopted []Record `json:"adopted,omitempty"`
}

// records checks the lists against each other and returns them as one.
func (d journalData) records() ([]Record, error) {
	for _, r := range d.Records {
		if r.Phase == Adopted {
			return nil, fmt.Errorf("record %s is among the instances made", r)
		}
	}
	for _, r := range d.Adopted {
		if r.Phase != Adopted {
			return nil, fmt.Errorf("record %s is among the instances adopted", r)
		}
	}
	return append(d.Records, d.Adopted...), nil
}

// decodeJournal reads journal bytes, of either version. Every error wraps
// durablefile.ErrCorrupt, except ErrNewerVersion for a journal a newer
// plugin verifiably wrote.
func decodeJournal(raw []byte, name string) ([]Record, error) {
	if legacy, ok := isLegacy(raw); ok {
		records, err := legacy.records()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", durablefile.ErrCorrupt, name, err)
		}
		return records, nil
	}
	version, data, err := journalFormat.Open(raw, name)
	if err != nil {
		return nil, err
	}
	if version != journalV3 {
		return nil, fmt.Errorf("%w: %s: unknown version %q", durablefile.ErrCorrupt, name, version)
	}
	var d journalData
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", durablefile.ErrCorrupt, name, err)
	}
	records, err := d.records()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", durablefile.ErrCorrupt, name, err)
	}
	return records, nil
}

// isLegacy reads a v1 journal: {"version": "v1", "records": [...],
// "adopted": [...]} with nothing of the envelope, which a damaged
// enveloped file never passes for.
func isLegacy(raw []byte) (journalData, bool) {
	var f struct {
		Version  string          `json:"version"`
		Checksum json.RawMessage `json:"checksum"`
		Sum      json.RawMessage `json:"sum"`
		Data     json.RawMessage `json:"data"`
		journalData
	}
	if err := json.Unmarshal(raw, &f); err != nil || f.Version != journalV1 || f.Checksum != nil || f.Sum != nil || f.Data != nil {
		return journalData{}, false
	}
	for i := range f.Records {
		// v1's half-made records had one phase; its boot is not known
		// either way (legacy records are settled in recover.go).
		if f.Records[i].Phase == "Creating" {
			f.Records[i].Phase = GIIntended
		}
	}
	return f.journalData, true
}

// encodeJournal writes records, sorted so that the file does not follow
// the order of calls.
func encodeJournal(records []Record) ([]byte, error) {
	records = slices.Clone(records)
	slices.SortFunc(records, func(a, b Record) int {
		return strings.Compare(string(a.Claim)+"/"+a.Device, string(b.Claim)+"/"+b.Device)
	})
	d := journalData{Records: []Record{}}
	for _, r := range records {
		if r.Phase == Adopted {
			d.Adopted = append(d.Adopted, r)
		} else {
			d.Records = append(d.Records, r)
		}
	}
	data, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode the MIG journal: %w", err)
	}
	return journalFormat.Seal(journalV3, data)
}

// journal reads and writes the records.
type journal struct {
	dir  string
	file *durablefile.File
}

func newJournal(dir string) journal {
	return journal{dir: dir, file: durablefile.New(dir, JournalFile)}
}

// load reads the records: from the file, or from its previous copy where
// the file is damaged (res says so). A missing journal has none.
func (j journal) load() ([]Record, durablefile.Result, error) {
	records, res, err := durablefile.Load(j.file, decodeJournal)
	if err != nil {
		return nil, res, fmt.Errorf("read MIG journal: %w", err)
	}
	return records, res, nil
}

// save writes the records and flushes them to disk: a record written
// before an NVML call must survive a power loss right after it, or the
// call's instance would be nobody's.
func (j journal) save(records []Record) error {
	raw, err := encodeJournal(records)
	if err != nil {
		return err
	}
	if err := j.file.Save(raw); err != nil {
		return fmt.Errorf("write MIG journal: %w", err)
	}
	if err := j.file.Sync(); err != nil {
		return fmt.Errorf("write MIG journal: %w", err)
	}
	return nil
}

// quarantine sets the journal's damaged copies aside, kept for diagnosis.
func (j journal) quarantine() ([]string, error) {
	return j.file.Quarantine(func(raw []byte, path string) bool {
		_, err := decodeJournal(raw, path)
		return err == nil || errors.Is(err, durablefile.ErrNewerVersion)
	})
}

// ReadJournal reads the records of the journal in dir as the plugin does,
// from its previous copy where the file is damaged (recoveredFrom then
// says what was wrong with it), and without the plugin's lock: the file is
// replaced by renames, so a read sees one whole version. A missing journal
// has no record. For the doctor.
func ReadJournal(dir string) (records []Record, recoveredFrom error, err error) {
	records, res, err := newJournal(dir).load()
	return records, res.RecoveredFrom, err
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
