package seatledger

import (
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Lock order, everywhere in the plugin: claim locks (in UID order), then
// the ledger's mutex, then the file lock shared with the other pod of a
// rolling update. A prepare holds its claims' locks from the choice of
// seats until its specs are written; a release holds them while it removes
// specs and entries. So a prepare and a release of the same claim never
// interleave in one plugin, and a release never removes a spec that a
// prepare is about to write.

// claimLocks are per-claim mutexes, made on first use and dropped when
// nobody holds or waits for them.
type claimLocks struct {
	mu    sync.Mutex
	locks map[types.UID]*claimLock
}

type claimLock struct {
	sync.Mutex
	users int
}

// lock takes the locks of uids, in UID order, and returns the function
// that releases them.
func (c *claimLocks) lock(uids []types.UID) func() {
	uids = slices.Compact(slices.Sorted(slices.Values(uids)))
	held := make([]*claimLock, 0, len(uids))
	for _, uid := range uids {
		c.mu.Lock()
		if c.locks == nil {
			c.locks = map[types.UID]*claimLock{}
		}
		l := c.locks[uid]
		if l == nil {
			l = &claimLock{}
			c.locks[uid] = l
		}
		l.users++
		c.mu.Unlock()
		l.Lock()
		held = append(held, l)
	}
	return func() {
		for i, l := range held {
			l.Unlock()
			c.mu.Lock()
			if l.users--; l.users == 0 {
				delete(c.locks, uids[i])
			}
			c.mu.Unlock()
		}
	}
}
