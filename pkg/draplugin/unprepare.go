package draplugin

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// UnprepareResourceClaims releases claims: their CDI specs go, their seats
// become free (their generations stay, so the next holder sees a new
// one). An unknown claim is already unprepared.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	start := d.opts.Clock.Now()
	// What the seat kinds made goes before the seats: a seat whose MIG
	// instance could not be destroyed stays held, and the kubelet's retry
	// destroys it.
	all := make([]types.UID, len(claims))
	for i, c := range claims {
		all[i] = c.UID
	}
	notReleased := map[types.UID]error{}
	for _, k := range d.kinds.list() {
		for uid, err := range k.Release(ctx, all) {
			if notReleased[uid] == nil {
				notReleased[uid] = err
			}
		}
	}
	var uids []types.UID
	for _, uid := range all {
		if notReleased[uid] == nil {
			uids = append(uids, uid)
		}
	}
	released, err := d.ledger.Release(ctx, uids)
	if err != nil {
		d.metrics.unprepareError("checkpoint")
		return nil, err
	}
	var gone []types.UID
	for _, uid := range uids {
		if released[uid] == nil {
			gone = append(gone, uid)
		}
	}
	for _, k := range d.kinds.list() {
		k.Released(ctx, gone)
	}
	results := map[types.UID]error{}
	for _, claim := range claims {
		if err := notReleased[claim.UID]; err != nil {
			d.metrics.unprepareError(kindOf(err, "mig"))
			results[claim.UID] = fmt.Errorf("unprepare claim %s (%s): %w", claim.NamespacedName, claim.UID, err)
			continue
		}
		if err := released[claim.UID]; err != nil {
			d.metrics.unprepareError("cdi")
			results[claim.UID] = fmt.Errorf("unprepare claim %s (%s): %w", claim.NamespacedName, claim.UID, err)
			continue
		}
		results[claim.UID] = nil
	}
	d.metrics.observeUnprepare(d.opts.Clock.Since(start), len(claims))
	return results, nil
}
