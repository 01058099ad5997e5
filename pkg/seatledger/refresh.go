package seatledger

import "context"

// Refresh reads the checkpoint again if another writer replaced it (the
// other pod of a rolling update), under the file lock shared with it, so
// that UsageChanged has told what the claims of both instances use by the
// time it returns. A decision that must not act on one instance's view
// alone (stopping a group's MPS daemon, lowering its limits, destroying a
// MIG instance) asks it first. It fails while the checkpoint is lost.
// Where no other instance shares the checkpoint there is nothing to read:
// it returns at once.
func (l *Ledger) Refresh(ctx context.Context) error {
	if !l.opts.SharedWithPeer {
		return nil
	}
	unlock, err := l.rec.lock()
	if err != nil {
		return err
	}
	defer unlock()
	_, err = l.rec.state(ctx)
	return err
}
