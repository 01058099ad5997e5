package mps

import (
	"errors"
	"fmt"
	"os"
)

// Recorded is what a daemon's record says, for a reader that only looks
// (the doctor).
type Recorded struct {
	// PID is the daemon's process; 0 while a start is under way, or
	// after one failed (the watcher tries again).
	PID int
	// Limits are the limits last set on the daemon, as its defaults and
	// on its servers; nil until a plugin set some.
	Limits *Limits
}

// ReadRecord reads the record of group name's daemon under root as the
// plugins left it: nil where there is none (no daemon is wanted). It
// takes no lock and changes nothing, so that it is safe beside a running
// plugin, and it refuses what the plugin refuses: a link or another
// user's file in place of the daemon's directory or record.
func ReadRecord(root, name string) (*Recorded, error) {
	if err := checkName("group", name); err != nil {
		return nil, err
	}
	parent, err := os.Open(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the MPS root: %w", err)
	}
	defer func() { _ = parent.Close() }()
	r, err := groupDir{parent: parent, name: name}.readRecord()
	if r == nil || err != nil {
		return nil, err
	}
	return &Recorded{PID: r.PID, Limits: r.Limits}, nil
}
