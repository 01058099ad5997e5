package draplugin

import (
	"context"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// PrepareResourceClaims prepares the claims of a pod. The state machine of
// one claim:
//
//	(absent) --assign seats, save--> PrepareStarted
//	PrepareStarted --write CDI spec, write claim status, save--> PrepareCompleted
//	PrepareCompleted --(repeated prepare)--> same seats, same CDI IDs; the
//	                   spec is written again if it went missing
//
// The checkpoint is saved before any side effect, so a crash at any point
// leaves a state from which the next prepare continues with the same seats,
// and the next start removes what no entry owns. A bad claim fails its own
// result; only an unreadable or unwritable checkpoint fails the call.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.metrics.observePrepareStart()
	start := d.clock.Now()
	if d.lost.Load() {
		d.metrics.observePrepare(d.clock.Since(start), len(claims))
		results := map[types.UID]kubeletplugin.PrepareResult{}
		for _, claim := range claims {
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): the plugin's checkpoint was lost and is not rebuilt yet (the API server did not answer); seats cannot be chosen safely until it is, retrying", claim.Namespace, claim.Name, claim.UID)}
		}
		return results, nil
	}
	st, err := d.loadState(ctx)
	if err != nil {
		d.metrics.prepareError("checkpoint")
		return nil, err
	}

	results := map[types.UID]kubeletplugin.PrepareResult{}
	var pending []*resourceapi.ResourceClaim
	changed := false
	for _, claim := range claims {
		if c, ok := st.Claims[claim.UID]; ok && c.Phase == checkpoint.PrepareCompleted {
			results[claim.UID] = d.completedResult(ctx, claim.UID, c)
			continue
		}
		if _, err := d.assignSeats(st, claim); err != nil {
			d.metrics.prepareError("claim")
			logger.Error(err, "Cannot prepare claim", "claim", klog.KObj(claim), "uid", claim.UID)
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)}
			continue
		}
		pending = append(pending, claim)
		changed = true
	}
	if changed {
		d.hooks.run(HookBeforeStartedSave)
		if err := d.store.Save(st); err != nil {
			d.metrics.prepareError("checkpoint")
			return nil, fmt.Errorf("record seats in the checkpoint: %w", err)
		}
		d.hooks.run(HookAfterStartedSave)
	}

	for _, claim := range pending {
		c := st.Claims[claim.UID]
		if err := d.writeSpec(claim.UID, c); err != nil {
			d.metrics.prepareError("cdi")
			logger.Error(err, "Cannot write CDI spec", "claim", klog.KObj(claim))
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)}
			continue
		}
		d.hooks.run(HookAfterCDIWrite)
		if err := d.writeStatus(ctx, claim, c); err != nil {
			// The seat status is for operators; the pod can run without it.
			d.metrics.prepareError("status")
			logger.Error(err, "Cannot record the seats in the claim's status; the pod is not affected", "claim", klog.KObj(claim))
		}
		d.hooks.run(HookAfterStatusWrite)
		c.Phase = checkpoint.PrepareCompleted
		results[claim.UID] = d.result(claim.UID, c)
		logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "uid", claim.UID, "seats", describeSeats(c))
	}
	if len(pending) > 0 {
		if err := d.store.Save(st); err != nil {
			d.metrics.prepareError("checkpoint")
			return nil, fmt.Errorf("record prepared claims in the checkpoint: %w", err)
		}
		d.hooks.run(HookAfterCompletedSave)
	}
	d.metrics.observePrepare(d.clock.Since(start), len(claims))
	return results, nil
}

// completedResult answers a repeated prepare: the recorded seats and CDI
// IDs. The spec is written again if it is gone (the CDI directory is a
// tmpfs that a reboot empties).
func (d *Driver) completedResult(ctx context.Context, uid types.UID, c *checkpoint.Claim) kubeletplugin.PrepareResult {
	if !d.cdi.Exists(uid) {
		if err := d.writeSpec(uid, c); err != nil {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): restore CDI spec: %w", c.Namespace, c.Name, uid, err)}
		}
		klog.FromContext(ctx).Info("Restored missing CDI spec of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
	}
	return d.result(uid, c)
}

func (d *Driver) result(uid types.UID, c *checkpoint.Claim) kubeletplugin.PrepareResult {
	var r kubeletplugin.PrepareResult
	for _, dev := range c.Devices {
		kd := kubeletplugin.Device{Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device, CDIDeviceIDs: d.cdiIDs(uid, dev)}
		if dev.ShareID != "" {
			share := types.UID(dev.ShareID)
			kd.ShareID = &share
		}
		r.Devices = append(r.Devices, kd)
	}
	return r
}

func (d *Driver) writeSpec(uid types.UID, c *checkpoint.Claim) error {
	if len(c.Devices) == 0 {
		// A claim with no device of this driver gets no spec.
		return nil
	}
	devices, err := d.specDevices(uid, c)
	if err != nil {
		return err
	}
	return d.cdi.Write(uid, devices)
}

// UnprepareResourceClaims releases claims: their CDI specs go, their seats
// become free (their generations stay, so the next holder sees a new one).
// An unknown claim is already unprepared.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	start := d.clock.Now()
	results := map[types.UID]error{}
	if d.lost.Load() {
		// Without a checkpoint, releasing is still safe: the spec goes and
		// the rebuild will not find the claim allocated here any more.
		for _, claim := range claims {
			results[claim.UID] = d.cdi.Remove(claim.UID)
			// The API server may show the claim allocated for a while yet;
			// the rebuild must not bring it back.
			d.releasedWhileLost.Store(claim.UID, true)
		}
		return results, nil
	}
	st, err := d.loadState(ctx)
	if err != nil {
		d.metrics.unprepareError("checkpoint")
		return nil, err
	}
	changed := false
	for _, claim := range claims {
		results[claim.UID] = nil
		if err := d.cdi.Remove(claim.UID); err != nil {
			d.metrics.unprepareError("cdi")
			results[claim.UID] = fmt.Errorf("unprepare claim %s (%s): %w", claim.NamespacedName, claim.UID, err)
			continue
		}
		d.hooks.run(HookAfterCDIRemove)
		if c, ok := st.Claims[claim.UID]; ok {
			delete(st.Claims, claim.UID)
			changed = true
			logger.V(2).Info("Unprepared claim", "claim", claim.NamespacedName, "uid", claim.UID, "seats", describeSeats(c))
		}
	}
	if changed {
		if err := d.store.Save(st); err != nil {
			d.metrics.unprepareError("checkpoint")
			return nil, fmt.Errorf("release seats in the checkpoint: %w", err)
		}
		d.hooks.run(HookAfterUnprepareSave)
	}
	d.metrics.observeUnprepare(d.clock.Since(start), len(claims))
	return results, nil
}

// loadState reads the checkpoint at the start of every call: with rolling
// updates two plugin instances serve the node, serialised by a file lock,
// and either may have written last.
func (d *Driver) loadState(ctx context.Context) (*checkpoint.State, error) {
	st, res, err := d.store.Load()
	if err != nil {
		return nil, fmt.Errorf("read the checkpoint: %w", err)
	}
	if res.RecoveredFrom != nil {
		klog.FromContext(ctx).Error(res.RecoveredFrom, "Checkpoint was unusable; continuing from its previous copy")
		if err := d.store.Save(st); err != nil {
			return nil, fmt.Errorf("rewrite the checkpoint from its previous copy: %w", err)
		}
	}
	return st, nil
}

func describeSeats(c *checkpoint.Claim) []string {
	var out []string
	for _, dev := range c.Devices {
		out = append(out, fmt.Sprintf("%s seats %v gen %v", dev.Group+"/"+dev.Profile, dev.Seats, dev.Generations))
	}
	return out
}

var errStopped = errors.New("plugin stopped")
