package seatledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
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

// repair makes the node's files agree with the checkpoint before the
// kubelet can call: specs of recorded claims that are missing (a reboot
// empties the CDI directory) are written again, specs no claim owns are
// removed, and the boot ID is recorded.
func (l *Ledger) repair(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// During a rolling update the old pod still serves the kubelet. Take
	// the lock around its checkpoint changes, so that this repair neither
	// removes a spec the old pod just wrote nor saves an older checkpoint
	// over its newer one.
	unlock, err := l.lock()
	if err != nil {
		return err
	}
	defer unlock()
	st, res, err := l.store.Load()
	if errors.Is(err, checkpoint.ErrCorrupt) {
		return l.repairLost(ctx, err)
	}
	if err != nil {
		return fmt.Errorf("read the checkpoint %s: %w", l.store.Path(), err)
	}
	if res.RecoveredFrom != nil {
		logger.Error(res.RecoveredFrom, "Checkpoint was unusable; continuing from its previous copy")
	}
	bootID := readBootID(l.opts.BootIDFile)
	if st.BootID != "" && bootID != "" && st.BootID != bootID {
		// Saves are flushed to disk right behind the calls that made
		// them; a power loss may still have taken the last few. A
		// generation handed out then must not repeat: start above the
		// clock, as after a rebuild. The kubelet prepares every claim
		// again after a reboot; claims whose unprepare was lost are found
		// by ReleaseStale.
		st.RaiseGenerationFloor(l.opts.Clock.Now().Unix())
		logger.Info("The node rebooted since the plugin last ran; restoring the CDI specs of prepared claims", "claims", len(st.Claims), "generationFloor", st.GenerationFloor)
	}
	st.BootID = bootID
	for uid, c := range st.Claims {
		// A fenced claim's spec is not known: whatever is on disk stays.
		if c.Phase != checkpoint.PrepareCompleted || c.Fenced() || l.opts.Specs.Exists(uid) {
			continue
		}
		if err := l.opts.Specs.Write(uid, c); err != nil {
			// Its next prepare reports the problem for this claim alone.
			logger.Error(err, "Cannot restore the CDI spec of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
			continue
		}
		logger.Info("Restored the CDI spec of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
	}
	l.removeOrphanSpecs(ctx, func(uid types.UID) bool {
		_, owned := st.Claims[uid]
		return owned
	})
	if err := l.save(ctx, st); err != nil {
		return fmt.Errorf("write the checkpoint: %w", err)
	}
	return nil
}

// repairLost handles a checkpoint whose copies are both unusable: never
// trusted, it is rebuilt from the API server; if the API server does not
// answer, the ledger starts without it, refuses new claims with a clear
// error, keeps releasing, and rebuilds in the background. Call with the
// lock held.
func (l *Ledger) repairLost(ctx context.Context, cause error) error {
	logger := klog.FromContext(ctx)
	logger.Error(cause, "The checkpoint and its previous copy are unusable; rebuilding it from the API server")
	l.countError("prepare", "checkpoint")
	rctx, cancel := context.WithTimeout(ctx, rebuildTimeout)
	rb, err := l.rec.rebuild(rctx)
	cancel()
	if err == nil {
		summary, err := l.adopt(ctx, rb)
		if err != nil {
			return err
		}
		l.opts.Events.Warning(ctx, nodeevents.ReasonCheckpointRebuilt, fmt.Sprintf("The plugin's checkpoint and its previous copy were unusable (%v); %s", cause, summary))
		return nil
	}
	logger.Error(err, "Cannot rebuild the checkpoint now; new claims are refused until it is rebuilt")
	l.opts.Events.Warning(ctx, nodeevents.ReasonCheckpointLost, "The plugin's checkpoint is unusable and the API server does not answer; new claims on this node are refused until the checkpoint is rebuilt")
	l.lost.Store(true)
	l.wg.Go(func() { l.recoverLost(ctx) })
	return nil
}

// recoverLost runs in the background while the checkpoint is lost: it
// retries the rebuild until the API server answers, then makes the ledger
// whole again.
func (l *Ledger) recoverLost(ctx context.Context) {
	logger := klog.FromContext(ctx)
	_ = wait.ExponentialBackoffWithContext(ctx, apiRetry(), func(ctx context.Context) (bool, error) {
		rb, err := l.rec.rebuild(ctx)
		if err != nil {
			logger.Error(err, "Rebuilding the lost checkpoint failed; retrying")
			return false, nil
		}
		unlock, err := l.lock()
		if err != nil {
			logger.Error(err, "Rebuilding the lost checkpoint failed; retrying")
			return false, nil
		}
		defer unlock()
		summary, err := l.adopt(ctx, rb)
		if err != nil {
			logger.Error(err, "Rebuilding the lost checkpoint failed; retrying")
			return false, nil
		}
		l.lost.Store(false)
		l.opts.Events.Warning(ctx, nodeevents.ReasonCheckpointRebuilt, "The plugin's checkpoint was lost; "+summary)
		return true, nil
	})
}

func readBootID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// removeOrphanSpecs removes the specs of claims that keep returns false
// for. What the plugin does not own (a file with its prefix and an odd
// name), or cannot remove (a read-only directory), is logged and left:
// the plugin starts all the same, and a spec nobody owns hands out no
// seat (only a claim's own prepare names its CDI devices).
func (l *Ledger) removeOrphanSpecs(ctx context.Context, keep func(types.UID) bool) {
	logger := klog.FromContext(ctx)
	uids, skipped, err := l.opts.Specs.Claims()
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
		if err := l.opts.Specs.Remove(uid); err != nil {
			l.countError("prepare", "cdi")
			logger.Error(err, "Cannot remove a CDI spec that no prepared claim owns; leaving it", "uid", uid)
			continue
		}
		logger.Info("Removed a CDI spec that no prepared claim owns", "uid", uid)
	}
}
