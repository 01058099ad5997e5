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

// PrepareResourceClaims prepares the claims of a pod. The life of one
// claim:
//
//	(absent) --choose seats, save checkpoint--> prepared (spec owed)
//	         --write CDI spec--> answered; the claim's status is written behind
//	prepared --repeated prepare--> the same seats and CDI IDs; the spec is
//	         written again if it is missing
//
// Seats are saved before any side effect, so a crash at any point leaves a
// state from which the next prepare continues with the same seats, and the
// next start writes the specs that are owed and removes those no entry
// owns. Calls run concurrently: concurrent claims share one checkpoint
// save (reserve). A bad claim fails its own result; only an unreadable or
// unwritable checkpoint fails the call.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	d.hooks.run(HookPrepareStart)
	d.metrics.observePrepareStart()
	start := d.clock.Now()
	defer func() { d.metrics.observePrepare(d.clock.Since(start), len(claims)) }()
	results := map[types.UID]kubeletplugin.PrepareResult{}
	if d.lost.Load() {
		for _, claim := range claims {
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): the plugin's checkpoint was lost and is not rebuilt yet (the API server did not answer); seats cannot be chosen safely until it is, retrying", claim.Namespace, claim.Name, claim.UID)}
		}
		return results, nil
	}
	r := d.reserve(ctx, claims)
	if r.err != nil {
		d.metrics.prepareError("checkpoint")
		return nil, r.err
	}
	for _, claim := range claims {
		if err := r.errs[claim.UID]; err != nil {
			results[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		c := r.entries[claim.UID]
		if !r.fresh[claim.UID] {
			results[claim.UID] = d.completedResult(ctx, claim.UID, c)
			continue
		}
		if err := d.writeSpec(claim.UID, c); err != nil {
			// The seats stay recorded: the kubelet retries the prepare,
			// which writes the spec, or unprepares the claim.
			d.metrics.prepareError("cdi")
			logger.Error(err, "Cannot write CDI spec", "claim", klog.KObj(claim))
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)}
			continue
		}
		d.hooks.run(HookAfterCDIWrite)
		d.statusQueue.AddAfter(claim.UID, statusWriteDelay)
		results[claim.UID] = d.result(claim.UID, c)
		logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "uid", claim.UID, "seats", describeSeats(c))
	}
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
	unlock, err := d.lockFile()
	if err != nil {
		d.metrics.unprepareError("checkpoint")
		return nil, err
	}
	defer unlock()
	st, err := d.state(ctx)
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
		if err := d.save(st); err != nil {
			d.metrics.unprepareError("checkpoint")
			d.st = nil
			return nil, fmt.Errorf("release seats in the checkpoint: %w", err)
		}
		d.hooks.run(HookAfterUnprepareSave)
	}
	d.metrics.observeUnprepare(d.clock.Since(start), len(claims))
	return results, nil
}

func describeSeats(c *checkpoint.Claim) []string {
	var out []string
	for _, dev := range c.Devices {
		out = append(out, fmt.Sprintf("%s seats %v gen %v", dev.Group+"/"+dev.Profile, dev.Seats, dev.Generations))
	}
	return out
}

var errStopped = errors.New("plugin stopped")
