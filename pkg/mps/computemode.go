package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A daemon's start puts its GPUs in compute mode EXCLUSIVE_PROCESS unless
// its group keeps the mode; its stop, its failed start and the watcher
// that finishes a stop set them back to DEFAULT. Those may run in a later
// plugin, whose plan may lack the group or give it another profile, so
// what the start did is recorded in the daemon's directory before any GPU
// is touched: keptModeFile there says the mode was left as it was. Its
// absence means EXCLUSIVE_PROCESS, which is what a directory made before
// the option existed means too. A stop that set them all back records
// that in restoredFile, until the next start sets EXCLUSIVE_PROCESS: a
// later stop, or a start that keeps the mode, sets none again, over what
// the node's administrator may have set since.
//
// A stop leaves EXCLUSIVE_PROCESS the GPUs another group's daemon serves
// (overlap.go); that daemon may have kept the mode, for it started on a
// GPU whose earlier daemon had ended before its stop was finished. So the
// stop records those GPUs in that daemon's directory (owedFile), and that
// daemon's stop sets them back to DEFAULT, whatever its own start did: the
// last daemon on a GPU leaves it as the plugin found it.

// keptModeFile, in a daemon's directory, says its start left the compute
// mode of its GPUs as it was.
const keptModeFile = "compute-mode-kept"

// restoredFile, in a daemon's directory, says its GPUs were set back to
// DEFAULT after its last start that set them EXCLUSIVE_PROCESS.
const restoredFile = "compute-mode-restored"

// owedFile, in a daemon's directory, names the GPUs another group's stop
// left in EXCLUSIVE_PROCESS because this daemon served them.
const owedFile = "compute-mode-owed"

// keptComputeMode tells whether the group's daemon was started with its
// GPUs' compute mode left as it was.
func (g groupDir) keptComputeMode() bool {
	_, err := g.root.Lstat(filepath.Join(g.name, keptModeFile))
	return err == nil
}

// markComputeMode records what the start of the group's daemon does to the
// compute mode of its GPUs. A group whose last daemon put its GPUs in
// EXCLUSIVE_PROCESS and that now keeps the mode first sets those GPUs back
// to DEFAULT (but those another group's daemon serves), as that daemon's
// stop did or would have: a mode the plugin set is not left behind by a
// change of profile.
func (d *daemon) markComputeMode(ctx context.Context, dir *os.File) error {
	kept := d.dir.keptComputeMode()
	switch {
	case d.g.KeepComputeMode && !kept:
		if gpus := d.dir.gpus(); len(gpus) > 0 {
			if err := d.setDefault(ctx, gpus); err != nil {
				return err
			}
		}
		if err := writeAt(dir, keptModeFile, nil, 0o644); err != nil {
			return fmt.Errorf("record that the compute mode is kept: %w", err)
		}
	case !d.g.KeepComputeMode:
		for _, name := range []string{keptModeFile, restoredFile} {
			err := unix.Unlinkat(int(dir.Fd()), name, 0)
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("record that the compute mode is set: remove %s: %w", filepath.Join(dir.Name(), name), err)
			}
		}
	}
	return nil
}

// restoredComputeMode tells whether the GPUs of the group's daemon were
// set back to DEFAULT since its last start set them EXCLUSIVE_PROCESS.
func (g groupDir) restoredComputeMode() bool {
	_, err := g.root.Lstat(filepath.Join(g.name, restoredFile))
	return err == nil
}

// markRestored records that the GPUs of the group's daemon are back in
// DEFAULT.
func (g groupDir) markRestored() error {
	dir, err := g.open()
	if err != nil {
		return err
	}
	defer func() { _ = dir.Close() }()
	if err := writeAt(dir, restoredFile, nil, 0o644); err != nil {
		return fmt.Errorf("record that the compute mode is set back: %w", err)
	}
	return nil
}

// owed are the GPUs other groups' stops left to the daemon to set back to
// DEFAULT.
func (g groupDir) owed() []string {
	data, err := g.readFile(owedFile)
	if err != nil {
		return nil
	}
	return strings.Fields(string(data))
}

// owe records that the daemon's stop sets uuids back to DEFAULT too.
func (g groupDir) owe(uuids []string) error {
	dir, err := g.open()
	if err != nil {
		return err
	}
	defer func() { _ = dir.Close() }()
	all := slices.Compact(slices.Sorted(slices.Values(slices.Concat(g.owed(), uuids))))
	return replaceAt(dir, owedFile, []byte(strings.Join(all, "\n")), 0o644)
}

// forgetOwed records that the GPUs owed are settled.
func (g groupDir) forgetOwed() error {
	err := g.root.Remove(filepath.Join(g.name, owedFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("record that the GPUs owed by MPS daemon %s are set back: %w", g.name, err)
	}
	return nil
}
