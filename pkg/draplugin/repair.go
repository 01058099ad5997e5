package draplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// repair makes the node's files agree with the checkpoint before the
// kubelet can call: specs of prepared claims that are missing (a reboot
// empties the CDI directory) are written again, specs no claim owns are
// removed, and the boot ID is recorded.
func (d *Driver) repair(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// During a rolling update the old pod still serves the kubelet. Take
	// the lock around its checkpoint changes, so that this repair neither
	// removes a spec the old pod just wrote nor saves an older checkpoint
	// over its newer one.
	unlock, err := d.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	st, res, err := d.store.Load()
	if errors.Is(err, checkpoint.ErrCorrupt) {
		return d.repairLost(ctx, err)
	}
	if err != nil {
		return fmt.Errorf("read the checkpoint %s: %w", d.store.Path(), err)
	}
	if res.RecoveredFrom != nil {
		logger.Error(res.RecoveredFrom, "Checkpoint was unusable; continuing from its previous copy")
	}
	bootID := readBootID(d.opts.BootIDFile)
	if st.BootID != "" && bootID != "" && st.BootID != bootID {
		// Saves are flushed to disk right behind the calls that made
		// them; a power loss may still have taken the last few. A
		// generation handed out then must not repeat: start above the
		// clock, as after a rebuild. The kubelet prepares every claim
		// again after a reboot; claims whose unprepare was lost are found
		// by releaseStale.
		st.RaiseGenerationFloor(d.clock.Now().Unix())
		logger.Info("The node rebooted since the plugin last ran; restoring the CDI specs of prepared claims", "claims", len(st.Claims), "generationFloor", st.GenerationFloor)
	}
	st.BootID = bootID
	for uid, c := range st.Claims {
		if c.Phase != checkpoint.PrepareCompleted || d.cdi.Exists(uid) {
			continue
		}
		if err := d.writeSpec(uid, c); err != nil {
			// Its next prepare reports the problem for this claim alone.
			logger.Error(err, "Cannot restore the CDI spec of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
			continue
		}
		logger.Info("Restored the CDI spec of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
	}
	specs, err := d.cdi.Claims()
	if err != nil {
		return err
	}
	for _, uid := range specs {
		if _, owned := st.Claims[uid]; owned {
			continue
		}
		if err := d.cdi.Remove(uid); err != nil {
			return err
		}
		logger.Info("Removed a CDI spec that no prepared claim owns", "uid", uid)
	}
	if err := d.save(st); err != nil {
		return fmt.Errorf("write the checkpoint: %w", err)
	}
	return nil
}

// repairLost handles a checkpoint whose copies are both unusable: never
// trusted, it is rebuilt from the API server; if the API server does not
// answer, the plugin starts without it, refuses new prepares with a clear
// error, keeps unpreparing, and rebuilds in the background. Call with d.mu
// held.
func (d *Driver) repairLost(ctx context.Context, cause error) error {
	logger := klog.FromContext(ctx)
	logger.Error(cause, "The checkpoint and its previous copy are unusable; rebuilding it from the API server")
	d.metrics.errors.WithLabelValues("prepare", "checkpoint").Inc()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	st, allocated, err := d.rebuild(rctx)
	cancel()
	if err == nil {
		if err := d.adopt(ctx, st, allocated); err != nil {
			return err
		}
		logger.Info("Rebuilt the checkpoint from the API server", "claims", len(st.Claims))
		d.event(corev1.EventTypeWarning, "CheckpointRebuilt", fmt.Sprintf("The plugin's checkpoint and its previous copy were unusable (%v); rebuilt %d prepared claims from the API server", cause, len(st.Claims)))
		return nil
	}
	logger.Error(err, "Cannot rebuild the checkpoint now; new claims are refused until it is rebuilt")
	d.event(corev1.EventTypeWarning, "CheckpointLost", "The plugin's checkpoint is unusable and the API server does not answer; new claims on this node are refused until the checkpoint is rebuilt")
	d.lost.Store(true)
	go d.recoverLostState(ctx)
	return nil
}

func readBootID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
