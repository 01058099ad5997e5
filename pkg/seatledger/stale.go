package seatledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// An entry whose claim no longer exists, or is no longer allocated on this
// node, holds seats nobody will release: the kubelet unprepares only
// claims it knows. A power loss can leave one (a release saved but not yet
// flushed), and so can a kubelet that lost its own state. Such an entry
// would keep its seats, and with unavailableGroups: hideBlocked also the groups
// it blocks, out of the scheduler's reach for good. At every start the
// plugin asks the API server about each held claim and releases those that
// are gone.

// staleReleaser finds the recorded claims the API server no longer
// allocates on this node and releases them.
type staleReleaser struct {
	rec    *record
	claims *claimLocks
	client resourceclient.ResourceClaimsGetter
	pool   string
	specs  Specs
	events *nodeevents.Recorder
}

// ReleaseStale checks every recorded claim against the API server and
// releases those the API server no longer allocates on this node. It
// retries until the API server answers or ctx ends.
func (l *Ledger) ReleaseStale(ctx context.Context) { l.stale.run(ctx) }

// run is ReleaseStale.
func (s *staleReleaser) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	_ = wait.ExponentialBackoffWithContext(ctx, apiRetry(), func(ctx context.Context) (bool, error) {
		stale, err := s.find(ctx)
		if err != nil {
			logger.Error(err, "Cannot check the held claims against the API server; retrying")
			return false, nil
		}
		if len(stale) == 0 {
			return true, nil
		}
		if err := s.release(ctx, stale); err != nil {
			logger.Error(err, "Cannot release the seats of claims that are gone; retrying")
			return false, nil
		}
		return true, nil
	})
}

// find returns the recorded claims that no longer exist, were
// replaced, or are no longer allocated on this node, with why.
func (s *staleReleaser) find(ctx context.Context) (map[types.UID]staleClaim, error) {
	held := map[types.UID]types.NamespacedName{}
	s.rec.mu.Lock()
	if s.rec.st != nil {
		for uid, c := range s.rec.st.Claims {
			held[uid] = types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
		}
	}
	s.rec.mu.Unlock()
	stale := map[types.UID]staleClaim{}
	for uid, ref := range held {
		why, err := s.why(ctx, uid, ref)
		if err != nil {
			return nil, err
		}
		if why != "" {
			stale[uid] = staleClaim{ref, why}
		}
	}
	return stale, nil
}

// staleClaim is a recorded claim the API server no longer allocates here.
type staleClaim struct {
	ref types.NamespacedName
	why string
}

// why asks the API server about a recorded claim: why it is stale,
// or "" if it is still allocated here.
func (s *staleReleaser) why(ctx context.Context, uid types.UID, ref types.NamespacedName) (string, error) {
	claim, err := s.client.ResourceClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "the claim no longer exists", nil
	case err != nil:
		return "", fmt.Errorf("get claim %s: %w", ref, err)
	case claim.UID != uid:
		return fmt.Sprintf("the claim was replaced (now %s)", claim.UID), nil
	case !allocatedOn(claim, s.pool):
		return "the claim is no longer allocated on this node", nil
	}
	return "", nil
}

// allocatedOn reports whether any of the claim's results is a device of
// this driver in pool.
func allocatedOn(claim *resourceapi.ResourceClaim, pool string) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == driver.Name && r.Pool == pool {
			return true
		}
	}
	return false
}

// release drops stale claims: their specs go, their seats become
// free. A claim whose spec cannot be removed keeps its seats (its
// containers may still start from the spec); the error says which.
func (s *staleReleaser) release(ctx context.Context, stale map[types.UID]staleClaim) error {
	logger := klog.FromContext(ctx)
	defer s.claims.lock(slices.Collect(maps.Keys(stale)))()
	// Under the claims' locks no prepare of them runs. One may have run
	// since they were found stale (the claim allocated here again, under
	// the same UID): ask once more.
	for uid, sc := range stale {
		why, err := s.why(ctx, uid, sc.ref)
		if err != nil {
			return err
		}
		if why == "" {
			delete(stale, uid)
		}
	}
	unlock, err := s.rec.lock()
	if err != nil {
		return err
	}
	defer unlock()
	st, err := s.rec.state(ctx)
	if err != nil {
		return err
	}
	changed := false
	var failed []error
	for _, uid := range slices.Sorted(maps.Keys(stale)) {
		c, ok := st.Claims[uid]
		if !ok {
			continue
		}
		if err := s.specs.Remove(uid, types.NamespacedName{Namespace: c.Namespace, Name: c.Name}); err != nil {
			s.rec.countError("unprepare", "cdi")
			failed = append(failed, fmt.Errorf("claim %s/%s (%s) keeps its seats: %w", c.Namespace, c.Name, uid, err))
			continue
		}
		delete(st.Claims, uid)
		changed = true
		why := stale[uid].why
		logger.Info("Released the seats of a claim the kubelet will not unprepare", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "reason", why, "seats", DescribeSeats(c))
		s.events.Normal(ctx, nodeevents.ReasonStaleClaimReleased, fmt.Sprintf("Released the seats of claim %s/%s (%s): %s", c.Namespace, c.Name, uid, why))
	}
	if changed {
		if err := s.rec.save(ctx, st); err != nil {
			s.rec.st = nil
			return fmt.Errorf("release stale claims in the checkpoint: %w", err)
		}
	}
	return errors.Join(failed...)
}
