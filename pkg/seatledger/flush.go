package seatledger

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// A burst of prepares saves every few milliseconds; a flush commits the
// file system's journal, which holds up the renames and spec writes of the
// calls still running. So the flusher waits until saves have been quiet
// for flushQuiet, but never longer than flushMaxDelay after the first save
// it has not flushed: one flush per burst, and a bounded window in which
// a power loss can take saves (which the next start repairs).
const (
	flushQuiet    = 20 * time.Millisecond
	flushMaxDelay = 200 * time.Millisecond
)

// flush makes every save durable soon after it happened: fsync of the
// checkpoint and its directory, coalescing saves that come meanwhile.
func (r *record) flush(ctx context.Context) {
	clk := r.opts.Clock
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.flushCh:
		}
		deadline := clk.Now().Add(flushMaxDelay)
	gather:
		for {
			select {
			case <-ctx.Done():
				break gather
			case <-r.flushCh:
				if !clk.Now().Before(deadline) {
					break gather
				}
			case <-clk.After(flushQuiet):
				break gather
			}
		}
		if err := r.store.Sync(); err != nil {
			r.countError("prepare", "checkpoint")
			klog.FromContext(ctx).Error(err, "Cannot flush the checkpoint to disk; it is safe against a plugin crash, not yet against a power loss")
		}
	}
}
