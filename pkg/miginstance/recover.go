package miginstance

// Every operation reads the journal under its lock through load, which
// settles what must not stay before anything else is done, so that no
// damage to the file stops MIG seats and no record of another boot acts:
//
//   - The file is damaged and its previous copy is good: the previous copy
//     is used. It may be one write behind the damaged file, so a GIMade or
//     CIIntended record whose instance is whole is completed as Created
//     (the lost write may have been its "Created"; destroying it would
//     take a MIG device a container uses), and the rules of journal.go do
//     the rest. A half-made record the lost write added is not there: what
//     its step made is left, as an instance the plugin did not make.
//   - Both are damaged: they are set aside (<file>.corrupt-<time>) and the
//     journal is rebuilt from NVML and the seat checkpoint (Options.Held):
//     the instance at the placement of a MIG device a held claim names,
//     where it is one that seat can be (of its profile, one compute
//     instance spanning it), is recorded Adopted for that claim, so that
//     the claim keeps it and no other claim is given it. Whether the plugin
//     made it was the journal's to say; a rebuilt record therefore never
//     destroys it, and once released it is a static seat. Every other
//     instance is left as it is, as one the plugin did not make.
//   - A record of another boot is forgotten, and one with no boot (a v1
//     journal's) is kept only where its instance is whole under the IDs
//     and UUID it records (a MIG device's UUID is new each time one is
//     made), else forgotten: nothing is destroyed for either.
//
// Each recovery is logged, and a damaged journal reported (Options.Warn).

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/durablefile"
)

// The reasons of the warnings a recovery gives (Options.Warn).
const (
	// ReasonMIGJournalRecovered: the journal was damaged and its previous
	// copy used.
	ReasonMIGJournalRecovered = "MIGJournalRecovered"
	// ReasonMIGJournalRebuilt: the journal and its previous copy were
	// damaged, and it was rebuilt from NVML and the seat checkpoint.
	ReasonMIGJournalRebuilt = "MIGJournalRebuilt"
)

// Held says which MIG devices the claims of the seat checkpoint hold, each
// as the Want of its claim and device; known is false where that cannot
// be told (no readable checkpoint).
type Held func() (held []Want, known bool)

// load reads the records under the lock: recovered where the journal is
// damaged, of this boot only, saved where that changed them.
func (m *Manager) load(ctx context.Context) ([]Record, error) {
	records, res, err := m.journal.load()
	changed := false
	switch {
	case errors.Is(err, durablefile.ErrNewerVersion):
		return nil, err
	case err != nil:
		records = m.rebuild(ctx, err)
		changed = true
	case res.RecoveredFrom != nil:
		records = m.fromPrevious(ctx, records, res.RecoveredFrom)
		changed = true
	}
	records, forgot := m.thisBoot(ctx, records)
	if !changed && !forgot {
		return records, nil
	}
	if err := m.save("settle journal", records); err != nil {
		return nil, err
	}
	return records, nil
}

// warn reports what a recovery did.
func (m *Manager) warn(ctx context.Context, reason, message string) {
	if m.opts.Warn != nil {
		m.opts.Warn(ctx, reason, message)
		return
	}
	klog.FromContext(ctx).Info("MIG journal", "reason", reason, "warning", message)
}

// fromPrevious continues from the previous copy, which may be one write
// behind the file it replaces.
func (m *Manager) fromPrevious(ctx context.Context, records []Record, damaged error) []Record {
	logger := klog.FromContext(ctx)
	for i, r := range records {
		g, err := m.gpu(r.GPU)
		if err != nil {
			continue // settled as any record is, later
		}
		if done, ok, err := g.complete(r); err != nil {
			logger.Error(err, "Cannot tell whether a half-made MIG instance of the journal's previous copy was made", "instance", r.String())
		} else if ok {
			logger.Info("The MIG journal's previous copy says an instance was being made, and it is whole: recorded as made", "instance", done.String())
			records[i] = done
		}
	}
	if !errors.Is(damaged, durablefile.ErrCorrupt) {
		// Only the previous copy is there: a crash between the renames of
		// a save, whose NVML call was not made yet.
		logger.Info("The MIG journal's previous copy is used", "reason", damaged.Error())
		return records
	}
	moved, err := m.journal.quarantine()
	if err != nil {
		logger.Error(err, "Cannot set the damaged MIG journal aside")
	}
	m.warn(ctx, ReasonMIGJournalRecovered, fmt.Sprintf("The MIG journal %s is damaged (%v); its previous copy is used, and the damaged file is kept as %v. An instance whose making the lost write recorded is left as one the plugin did not make; kubectl kyb doctor lists the GPUs' instances.",
		m.journal.file.Path(), damaged, moved))
	return records
}

// rebuild records again the instances the claims of the seat checkpoint
// hold; cause is why the journal could not be read.
func (m *Manager) rebuild(ctx context.Context, cause error) []Record {
	logger := klog.FromContext(ctx)
	moved, err := m.journal.quarantine()
	if err != nil {
		logger.Error(err, "Cannot set the damaged MIG journal aside")
	}
	var held []Want
	known := false
	if m.opts.Held != nil {
		held, known = m.opts.Held()
	}
	var records []Record
	for _, w := range held {
		g, err := m.gpu(w.GPU)
		var r Record
		var ok bool
		if err == nil {
			r, ok, err = g.heldInstance(w, m.opts.BootID)
		}
		if err != nil {
			logger.Error(err, "Cannot read the MIG instance of a held claim's device; it is left as one the plugin did not make", "claim", w.Claim, "device", w.Device)
			continue
		}
		if ok && recordAt(records, r.GPU, r.Placement()) < 0 {
			logger.Info("Rebuilt the MIG journal's record of a held claim's instance; it is never destroyed", "instance", r.String())
			records = append(records, r)
		}
	}
	what := fmt.Sprintf("the seat checkpoint's claims keep their %s, never destroyed; every other instance is left as one the plugin did not make", count(len(records), "MIG instance"))
	if !known {
		what = "the seat checkpoint cannot be read, so no instance can be shown to be a claim's: every instance is left as one the plugin did not make"
	}
	m.warn(ctx, ReasonMIGJournalRebuilt, fmt.Sprintf("The MIG journal and its previous copy are damaged (%v); they are kept as %v and the journal is rebuilt from the GPUs: %s. kubectl kyb doctor lists the GPUs' instances.",
		cause, moved, what))
	return records
}

// thisBoot forgets the records of another boot, and keeps those of no
// known boot only where their instance is whole.
func (m *Manager) thisBoot(ctx context.Context, records []Record) ([]Record, bool) {
	logger := klog.FromContext(ctx)
	keep := records[:0:0]
	for _, r := range records {
		switch {
		case r.Boot == m.opts.BootID:
			keep = append(keep, r)
			continue
		case r.Boot != "":
			logger.Info("Forgot a MIG journal record of an earlier boot: no MIG instance outlives a reboot, and what is at its placement now is not the record's", "instance", r.String(), "boot", r.Boot)
			continue
		case !r.Phase.Made():
			logger.Info("Forgot a half-made MIG record of a journal that names no boot: what is at its placement is left as it is", "instance", r.String())
			continue
		}
		g, err := m.gpu(r.GPU)
		if err != nil {
			logger.Error(err, "Forgot a MIG record of a journal that names no boot: its instance cannot be checked, and is left as it is", "instance", r.String())
			continue
		}
		st, _, err := g.check(r)
		if err != nil || st != whole {
			logger.Info("Forgot a MIG record of a journal that names no boot: its instance is not whole, and what is left is left as it is", "instance", r.String(), "err", err)
			continue
		}
		r.Boot = m.opts.BootID
		keep = append(keep, r)
	}
	return keep, len(keep) != len(records) || hasUnknownBoot(records)
}

func hasUnknownBoot(records []Record) bool {
	for _, r := range records {
		if r.Boot == "" {
			return true
		}
	}
	return false
}

// count is "1 thing" or "n things".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
