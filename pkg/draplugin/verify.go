package draplugin

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// An entry of the checkpoint whose claim no longer exists, or is no
// longer allocated on this node, holds seats nobody will release: the
// kubelet unprepares only claims it knows. A power loss can leave one (an
// unprepare saved but not yet flushed), and so can a kubelet that lost its
// own state. Such an entry would keep its seats, and with unavailableGroups:
// hide also the groups it blocks, out of the scheduler's reach for good.
// At every start the plugin asks the API server about each held claim and
// releases those that are gone.

// releaseStale checks every claim of the checkpoint against the API server
// and releases those the API server no longer allocates on this node. It
// retries until the API server answers or ctx ends.
func (d *Driver) releaseStale(ctx context.Context) {
	logger := klog.FromContext(ctx)
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: 1 << 30}
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		stale, err := d.findStale(ctx)
		if err != nil {
			logger.Error(err, "Cannot check the held claims against the API server; retrying")
			return false, nil
		}
		if len(stale) == 0 {
			return true, nil
		}
		if err := d.release(ctx, stale); err != nil {
			logger.Error(err, "Cannot release the seats of claims that are gone; retrying")
			return false, nil
		}
		return true, nil
	})
}

// findStale returns the held claims that no longer exist, were replaced,
// or are no longer allocated on this node, with why.
func (d *Driver) findStale(ctx context.Context) (map[types.UID]string, error) {
	type ref struct{ namespace, name string }
	held := map[types.UID]ref{}
	d.mu.Lock()
	if d.st != nil {
		for uid, c := range d.st.Claims {
			held[uid] = ref{c.Namespace, c.Name}
		}
	}
	d.mu.Unlock()
	stale := map[types.UID]string{}
	for uid, r := range held {
		claim, err := d.client.ResourceV1().ResourceClaims(r.namespace).Get(ctx, r.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			stale[uid] = "the claim no longer exists"
		case err != nil:
			return nil, fmt.Errorf("get claim %s/%s: %w", r.namespace, r.name, err)
		case claim.UID != uid:
			stale[uid] = fmt.Sprintf("the claim was replaced (now %s)", claim.UID)
		case !d.allocatedHere(claim):
			stale[uid] = "the claim is no longer allocated on this node"
		}
	}
	return stale, nil
}

func (d *Driver) allocatedHere(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == driver.Name && r.Pool == d.pool {
			return true
		}
	}
	return false
}

// release drops stale claims: their specs go, their seats become free.
func (d *Driver) release(ctx context.Context, stale map[types.UID]string) error {
	logger := klog.FromContext(ctx)
	unlock, err := d.lockState()
	if err != nil {
		return err
	}
	defer unlock()
	st, err := d.state(ctx)
	if err != nil {
		return err
	}
	changed := false
	for uid, why := range stale {
		c, ok := st.Claims[uid]
		if !ok {
			continue
		}
		if err := d.cdi.Remove(uid); err != nil {
			return err
		}
		delete(st.Claims, uid)
		changed = true
		logger.Info("Released the seats of a claim the kubelet will not unprepare", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "reason", why, "seats", describeSeats(c))
		d.event("Normal", "StaleClaimReleased", fmt.Sprintf("Released the seats of claim %s/%s (%s): %s", c.Namespace, c.Name, uid, why))
	}
	if !changed {
		return nil
	}
	if err := d.save(st); err != nil {
		d.st = nil
		return fmt.Errorf("release stale claims in the checkpoint: %w", err)
	}
	return nil
}
