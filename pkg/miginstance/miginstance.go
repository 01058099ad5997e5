// Package miginstance makes and destroys the MIG instances that MIG seats
// stand for, at prepare and unprepare, through NVML, and keeps a journal
// of them so that no crash leaves an instance nobody owns, and no record
// destroys an instance the plugin did not make (the journal's states and
// what each lets a restart destroy are at the top of journal.go).
//
// Reconcile, at start and behind a release of stale claims, settles what
// a crash left: a half-made record has what its interrupted step left
// rolled back; a Created record whose claim is no longer prepared has its
// instance destroyed; a record of an earlier boot is forgotten. Instances
// no record names (partitions an administrator made, or another tool) are
// never destroyed: the plugin publishes those that are seats of its
// configured profiles as static seats, which a claim adopts (an Adopted
// record, adopt.go), and withdraws what the others make impossible.
//
// A claim's seat is recorded in the seat checkpoint (package seatledger)
// before its instance is made, as for any seat; this package knows
// nothing of seats or claims beyond their UIDs, and the MIG devices the
// checkpoint's claims hold where the journal is lost (recover.go).
package miginstance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// Options configure a Manager.
type Options struct {
	// Dir holds the journal (the plugin's data directory).
	Dir string
	// NVML makes the instances.
	NVML Library
	// Minors reads /proc/driver/nvidia-caps/mig-minors.
	Minors func() ([]byte, error)
	// BootID is the node's boot (package bootid), recorded in every
	// record: a record of another boot is forgotten. Required.
	BootID string
	// Held, where both copies of the journal are damaged, says which MIG
	// devices the claims of the seat checkpoint hold: their instances are
	// recorded for them again (recover.go). nil: no instance can be shown
	// to be a claim's.
	Held Held
	// Warn tells the node's operators what a recovery of the journal did
	// (a Node event); nil: it is logged.
	Warn func(ctx context.Context, reason, message string)
	// Step, for tests only, is called before each NVML call and each
	// journal write that changes something, named; true stops the
	// operation there at once, as a crash of the plugin would (nothing
	// after it runs, not even a rollback).
	Step func(step string) bool
}

// Want is the instance one device of a claim stands for.
type Want struct {
	Claim  types.UID
	Device string
	// GPU is the parent's NVML index, GPUMinor its /dev/nvidiaN.
	GPU      int
	GPUMinor int
	GPUUUID  string
	// Architecture is the parent's ("ampere", "hopper", ...): MIG mode is
	// switched on at prepare only where it takes effect without a reset.
	Architecture string
	Profile      mig.Profile
	Placement    mig.Placement
	// Adopt says the device is a static seat: the instance at Placement,
	// which the plugin did not make, is the claim's, and is never
	// destroyed (adopt.go). Where it is gone, one is made as for any seat.
	Adopt bool
}

// Instance is a made instance: what a container needs to use it.
type Instance struct {
	GI, CI int
	// UUID is the MIG device's, MIG-….
	UUID string
	// CapabilityNodes are /dev/nvidia-caps/nvidia-cap<M> of the GPU
	// instance's and the compute instance's access capabilities.
	CapabilityNodes []string
}

// Manager makes and destroys instances. Its calls are serialised (one
// NVML sequence at a time on the node), with the other plugin pod of a
// rolling update as well (a file lock).
type Manager struct {
	opts    Options
	journal journal
	mu      sync.Mutex
	minors  minors
}

// errCrashed stops an operation where a test's Step said so.
var errCrashed = errors.New("stopped as by a crash")

// New returns a manager over the journal in opts.Dir.
func New(opts Options) (*Manager, error) {
	switch {
	case opts.Dir == "":
		return nil, errors.New("MIG instances: a journal directory is required")
	case opts.NVML == nil:
		return nil, errors.New("MIG instances: NVML is required")
	case opts.Minors == nil:
		return nil, errors.New("MIG instances: a mig-minors reader is required")
	case opts.BootID == "":
		return nil, errors.New("MIG instances: the node's boot ID is required")
	}
	return &Manager{opts: opts, journal: newJournal(opts.Dir), minors: minors{read: opts.Minors}}, nil
}

// step is the test's crash point; true: stop.
func (m *Manager) step(name string) bool { return m.opts.Step != nil && m.opts.Step(name) }

// lock serialises the manager's operations, within the plugin and with
// the other pod of a rolling update, and loads the records, recovered
// and of this boot (recover.go).
func (m *Manager) lock(ctx context.Context) (records []Record, unlock func(), err error) {
	m.mu.Lock()
	unlockFile, err := m.journal.lock()
	if err != nil {
		m.mu.Unlock()
		return nil, nil, err
	}
	unlock = func() { unlockFile(); m.mu.Unlock() }
	records, err = m.load(ctx)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return records, unlock, nil
}

// save writes records unless a test's crash point stops it first.
func (m *Manager) save(step string, records []Record) error {
	if m.step(step) {
		return errCrashed
	}
	return m.journal.save(records)
}

func find(records []Record, claim types.UID, device string) int {
	return slices.IndexFunc(records, func(r Record) bool { return r.Claim == claim && r.Device == device })
}

// Lookup returns the instance made for a device of a claim, from the
// journal (no NVML call). It takes no lock: the journal is replaced by
// renames, so a read sees one whole version (the previous one between
// them), and the seat ledger calls it with its own lock held, which
// Reconcile takes under the manager's.
func (m *Manager) Lookup(claim types.UID, device string) (Instance, bool, error) {
	records, _, err := m.journal.load()
	if err != nil {
		return Instance{}, false, err
	}
	i := find(records, claim, device)
	if i < 0 || !records[i].Phase.Made() || records[i].Boot != m.opts.BootID {
		return Instance{}, false, nil
	}
	inst, err := m.minors.instance(records[i])
	return inst, err == nil, err
}

// Ensure makes the instance w stands for, or returns it if it was made.
// A half-made one (a record an earlier try left) is rolled back first
// and made anew. On failure nothing is left made, unless the rollback
// failed too, in which case its record stays for Reconcile.
func (m *Manager) Ensure(ctx context.Context, w Want) (Instance, error) {
	records, unlock, err := m.lock(ctx)
	if err != nil {
		return Instance{}, err
	}
	defer unlock()
	g, err := m.gpu(w.GPU)
	if err != nil {
		return Instance{}, err
	}
	if i := find(records, w.Claim, w.Device); i >= 0 {
		inst, ok, err := m.reuse(ctx, g, w, records[i])
		if ok || err != nil {
			return inst, err
		}
		records = slices.Delete(records, i, i+1)
		if err := m.save("forget", records); err != nil {
			return Instance{}, err
		}
	}
	if w.Adopt {
		inst, found, err := m.adopt(ctx, g.dev, w, records)
		if found || err != nil {
			return inst, err
		}
		klog.FromContext(ctx).Info("The static MIG instance of a seat is gone; making one", "gpu", w.GPU, "profile", w.Profile.Name, "placement", w.Placement.String())
	}
	return m.make(ctx, g, w, records)
}

// reuse returns the instance of r, the journal's record of w, where it is
// w's and whole; else it destroys what is left of it (an Adopted
// record's instance is not destroyed, only forgotten) for the caller to
// forget the record.
func (m *Manager) reuse(ctx context.Context, g gpu, w Want, r Record) (inst Instance, ok bool, err error) {
	if r.Phase.Made() && r.GPU == w.GPU && r.ProfileID == w.Profile.ID && r.Placement() == w.Placement {
		st, _, err := g.check(r)
		if err != nil {
			return Instance{}, false, fmt.Errorf("check MIG instance %s: %w", r, err)
		}
		if st == whole {
			inst, err := m.minors.instance(r)
			return inst, true, err
		}
		klog.FromContext(ctx).Info("A MIG instance the journal records is gone; making it again", "instance", r.String())
	}
	if err := g.destroy(ctx, r); err != nil {
		return Instance{}, false, fmt.Errorf("roll back MIG instance %s: %w", r, err)
	}
	return Instance{}, false, nil
}

// make makes w's instance on g, recording each phase in the journal
// before the call it announces (create.go).
func (m *Manager) make(ctx context.Context, g gpu, w Want, records []Record) (Instance, error) {
	if err := g.migMode(ctx, w); err != nil {
		return Instance{}, err
	}
	// The minors file is read before anything is made: without it no
	// container could use the instance.
	if _, err := m.minors.load(); err != nil {
		return Instance{}, err
	}
	info, err := giProfileInfo(g.dev, w.Profile.Index, w.Profile.ID, w.Profile.Name)
	if err != nil {
		return Instance{}, fmt.Errorf("GPU %d: %w", w.GPU, err)
	}
	// An instance at exactly this placement is not this claim's (an
	// administrator's, or one a released claim still holds): refuse
	// before the journal says GIIntended, so that Reconcile never takes
	// it for one a crash left half made.
	if _, gInfo, found, err := instanceAt(g.dev, &info, w.Placement); err != nil {
		return Instance{}, fmt.Errorf("GPU %d: %w", w.GPU, err)
	} else if found {
		return Instance{}, fmt.Errorf("GPU %d: a MIG %s instance (GPU instance %d) that is not this claim's is at %s already: %w",
			w.GPU, w.Profile.Name, gInfo.Id, w.Placement, callErr("CreateGpuInstanceWithPlacement", nvml.ERROR_INSUFFICIENT_RESOURCES))
	}
	r := newRecord(w, GIIntended, m.opts.BootID)
	records = append(records, r)
	if err := m.save("record creating", records); err != nil {
		return Instance{}, err
	}
	// record writes the making's next phase; records holds what the
	// journal says.
	record := func(step string, r Record) error {
		next := slices.Clone(records)
		next[len(next)-1] = r
		if err := m.save(step, next); err != nil {
			return err
		}
		records = next
		return nil
	}
	undone, err := g.create(ctx, &info, r, record)
	switch {
	case errors.Is(err, errCrashed):
		return Instance{}, err
	case err != nil && !undone:
		klog.FromContext(ctx).Error(err, "Cannot roll back a half-made MIG instance; its record stays for the next reconcile", "instance", records[len(records)-1].String())
		return Instance{}, fmt.Errorf("GPU %d: make MIG %s at %s: %w", w.GPU, w.Profile.Name, w.Placement, err)
	case err != nil:
		if saveErr := m.save("forget failed", records[:len(records)-1]); saveErr != nil {
			return Instance{}, errors.Join(err, saveErr)
		}
		return Instance{}, fmt.Errorf("GPU %d: make MIG %s at %s: %w", w.GPU, w.Profile.Name, w.Placement, err)
	}
	created := records[len(records)-1]
	klog.FromContext(ctx).V(2).Info("Made MIG instance", "instance", created.String())
	return m.minors.instance(created)
}

// newRecord is a record of w's instance, in phase, of boot.
func newRecord(w Want, phase Phase, boot string) Record {
	return Record{
		Claim: w.Claim, Device: w.Device, GPU: w.GPU, GPUUUID: w.GPUUUID, GPUMinor: w.GPUMinor,
		Profile: w.Profile.Name, ProfileID: w.Profile.ID, ProfileIndex: w.Profile.Index, Start: w.Placement.Start, Size: w.Placement.Size,
		Phase: phase, Boot: boot,
	}
}
