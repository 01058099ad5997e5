package seatledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// rebuildTimeout bounds the rebuild of a lost checkpoint at start: past
// it, the plugin starts without one and rebuilds in the background.
const rebuildTimeout = 10 * time.Second

// apiRetry is how the ledger retries what needs the API server (a rebuild,
// the check of held claims) until it answers.
func apiRetry() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: 1 << 30}
}

// repairer makes the node's files and the record agree: at start, and
// whenever the checkpoint is lost, by rebuilding it from the API server
// and the specs on the node (rebuild.go) and adopting the result.
type repairer struct {
	rec  *record
	rc   *recoverer
	opts *Options
}

// atOpen makes the node's files agree with the checkpoint before the
// kubelet can call: specs of recorded claims that are missing (a reboot
// empties the CDI directory) are written again, specs no claim owns are
// removed, and the boot ID is recorded. A checkpoint that cannot be
// trusted is rebuilt instead (repairLost).
func (p *repairer) atOpen(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// During a rolling update the old pod still serves the kubelet. Take
	// the lock around its checkpoint changes, so that this repair neither
	// removes a spec the old pod just wrote nor saves an older checkpoint
	// over its newer one.
	unlock, err := p.rec.lock()
	if err != nil {
		return err
	}
	defer unlock()
	st, res, err := p.rec.store.Load()
	if errors.Is(err, checkpoint.ErrCorrupt) {
		return p.repairLost(ctx, fmt.Errorf("the checkpoint and its previous copy are unusable: %w", err), nil)
	}
	if err != nil {
		return fmt.Errorf("read the checkpoint %s: %w", p.rec.store.Path(), err)
	}
	if doubt := p.rec.doubt(st, res); doubt != nil {
		return p.repairLost(ctx, doubt, st)
	}
	if res.RecoveredFrom != nil {
		if err := p.rec.continueFromPrevious(ctx, st, res.RecoveredFrom); err != nil {
			return err
		}
	}
	bootID := p.opts.BootID
	if st.BootID != "" && bootID != "" && st.BootID != bootID {
		// Saves are flushed to disk right behind the calls that made
		// them; a power loss may still have taken the last few. A
		// generation handed out then must not repeat: start above the
		// clock, as after a rebuild. The kubelet prepares every claim
		// again after a reboot; claims whose unprepare was lost are found
		// by ReleaseStale.
		st.RaiseGenerationFloor(p.opts.Clock.Now().Unix())
		logger.Info("The node rebooted since the plugin last ran; restoring the CDI specs of prepared claims", "claims", len(st.Claims), "generationFloor", st.GenerationFloor)
	}
	st.BootID = bootID
	for uid, c := range st.Claims {
		// A fenced claim's spec is not known: whatever is on disk stays.
		if c.Phase != checkpoint.PrepareCompleted || c.Fenced() || p.opts.Specs.Complete(uid, c) {
			continue
		}
		if err := p.opts.Specs.Write(uid, c); err != nil {
			// Its next prepare reports the problem for this claim alone.
			logger.Error(err, "Cannot restore the CDI spec of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
			continue
		}
		logger.Info("Restored the CDI spec of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
	}
	p.removeOrphanSpecs(ctx, func(uid types.UID) bool {
		_, owned := st.Claims[uid]
		return owned
	})
	if err := p.rec.save(ctx, st); err != nil {
		return fmt.Errorf("write the checkpoint: %w", err)
	}
	return nil
}

// repairLost handles a checkpoint that cannot be trusted at start: it is
// rebuilt from the API server and the specs on the node; if the API server
// does not answer, the ledger starts without it, refuses new claims with a
// clear error, keeps releasing, and rebuilds in the background. baseline,
// if not nil, is what is left of the checkpoint (its previous copy). Call
// with the lock held.
func (p *repairer) repairLost(ctx context.Context, cause error, baseline *checkpoint.State) error {
	logger := klog.FromContext(ctx)
	logger.Error(cause, "The checkpoint cannot be trusted; rebuilding it from the API server and the CDI specs on the node")
	p.rec.countError("prepare", "checkpoint")
	rctx, cancel := context.WithTimeout(ctx, rebuildTimeout)
	rb, err := p.rc.rebuild(rctx)
	cancel()
	if err == nil {
		summary, err := p.adopt(ctx, rb, baseline)
		if err != nil {
			return err
		}
		p.opts.Events.Warning(ctx, nodeevents.ReasonCheckpointRebuilt, fmt.Sprintf("The plugin's checkpoint could not be trusted (%v); %s", cause, summary))
		return nil
	}
	logger.Error(err, "Cannot rebuild the checkpoint now")
	p.rec.enterLost(ctx, cause, baseline)
	return nil
}

// recoverWhenLost rebuilds the checkpoint each time it is lost, until ctx
// ends.
func (p *repairer) recoverWhenLost(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.rec.lostCh:
			if p.recoverLost(ctx) && p.opts.Recovered != nil {
				p.opts.Recovered()
			}
		}
	}
}

// recoverLost retries the rebuild of a lost checkpoint until the API
// server answers, then makes the ledger whole again. It reports whether
// it did (false: ctx ended).
func (p *repairer) recoverLost(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	err := wait.ExponentialBackoffWithContext(ctx, apiRetry(), func(ctx context.Context) (bool, error) {
		// The rebuild runs under the lock, so that nothing the other pod
		// of a rolling update prepares meanwhile is missed by it.
		unlock, err := p.rec.lock()
		if err != nil {
			logger.Error(err, "Rebuilding the lost checkpoint failed; retrying")
			return false, nil
		}
		defer unlock()
		if p.adoptPeer(ctx) {
			return true, nil
		}
		rctx, cancel := context.WithTimeout(ctx, rebuildTimeout)
		rb, err := p.rc.rebuild(rctx)
		cancel()
		if err == nil {
			var summary string
			if summary, err = p.adopt(ctx, rb, p.rec.baseline); err == nil {
				p.rec.lost.Store(false)
				p.opts.Events.Warning(ctx, nodeevents.ReasonCheckpointRebuilt, "The plugin's checkpoint was lost; "+summary)
				return true, nil
			}
		}
		logger.Error(err, "Rebuilding the lost checkpoint failed; retrying")
		return false, nil
	})
	return err == nil
}

// adoptPeer takes the checkpoint the other pod of a rolling update wrote
// while this one had lost it, if there is one that records every spec on
// the node. Call with the lock held.
func (p *repairer) adoptPeer(ctx context.Context) bool {
	st, res, err := p.rec.store.Load()
	if err != nil || res.Fresh || res.RecoveredFrom != nil || p.rec.specsRecorded(st) != nil {
		return false
	}
	for uid := range p.rec.releasedWhileLost {
		delete(st.Claims, uid)
	}
	if err := p.rec.save(ctx, st); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot adopt the checkpoint the other plugin pod wrote")
		return false
	}
	clear(p.rec.releasedWhileLost)
	p.rec.baseline = nil
	p.rec.lost.Store(false)
	klog.FromContext(ctx).Info("Adopted the checkpoint the other plugin pod of a rolling update wrote while this one had lost it", "claims", len(st.Claims))
	return true
}

// removeOrphanSpecs removes the specs of claims that keep returns false
// for. What the plugin does not own (a file with its prefix and an odd
// name), or cannot remove (a read-only directory), is logged and left:
// the plugin starts all the same, and a spec nobody owns hands out no
// seat (only a claim's own prepare names its CDI devices).
func (p *repairer) removeOrphanSpecs(ctx context.Context, keep func(types.UID) bool) {
	logger := klog.FromContext(ctx)
	uids, skipped, err := p.opts.Specs.Claims()
	if err != nil {
		logger.Error(err, "Cannot list the CDI specs; specs of claims no longer held stay until the next start")
		return
	}
	for _, name := range skipped {
		logger.Info("Left a file alone that looks like a claim's CDI spec but is not the plugin's", "file", name, "warning", "its name carries no claim UID the plugin writes")
	}
	for _, uid := range uids {
		if keep(uid) {
			continue
		}
		if err := p.opts.Specs.Remove(uid, types.NamespacedName{}); err != nil {
			p.rec.countError("prepare", "cdi")
			logger.Error(err, "Cannot remove a CDI spec that no prepared claim owns; leaving it", "uid", uid)
			continue
		}
		logger.Info("Removed a CDI spec that no prepared claim owns", "uid", uid)
	}
}
