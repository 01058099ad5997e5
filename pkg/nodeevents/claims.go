package nodeevents

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
)

// Reasons of the events on ResourceClaims.
const (
	// ReasonPrepared (Normal): the claim got its seats on the node.
	ReasonPrepared = "Prepared"
	// ReasonPrepareFailed (Warning): the node refused the claim, and why.
	ReasonPrepareFailed = "PrepareFailed"
)

// claimEventRepeat is how long the same event on the same claim is not
// recorded again: the kubelet retries a failed prepare every few seconds,
// and one event says as much as a hundred.
const claimEventRepeat = 5 * time.Minute

// claimEventsPerSecond and claimEventBurst bound the events on claims
// of one node: a burst of 64 pods is told in full, a storm of failures
// does not flood the API server.
const (
	claimEventsPerSecond = 5
	claimEventBurst      = 100
)

// Claim records an event of eventType about claim, on behalf of the node,
// unless the same one was recorded within claimEventRepeat or the node's
// claim events exceed their rate (each dropped event is logged at V(4)).
func (r *Recorder) Claim(ctx context.Context, claim *resourceapi.ResourceClaim, eventType, reason, note string) {
	logger := klog.FromContext(ctx)
	if eventType == corev1.EventTypeWarning {
		logger.Info("Claim event", "claim", klog.KObj(claim), "reason", reason, "warning", note)
	} else {
		logger.V(2).Info("Claim event", "claim", klog.KObj(claim), "reason", reason, "note", note)
	}
	if r == nil {
		return
	}
	key := string(claim.UID) + "\x00" + reason + "\x00" + note
	now := time.Now()
	r.mu.Lock()
	last, seen := r.claimEvents[key]
	allowed := (!seen || now.Sub(last) >= claimEventRepeat) && r.claimLimiter.AllowN(now, 1)
	if allowed {
		r.claimEvents[key] = now
		if len(r.claimEvents) > 4096 {
			for k, t := range r.claimEvents {
				if now.Sub(t) >= claimEventRepeat {
					delete(r.claimEvents, k)
				}
			}
		}
	}
	r.mu.Unlock()
	if !allowed {
		logger.V(4).Info("Claim event not recorded: repeated, or over the rate", "claim", klog.KObj(claim), "reason", reason)
		return
	}
	ref := &corev1.ObjectReference{Kind: "ResourceClaim", APIVersion: resourceapi.SchemeGroupVersion.String(), Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	r.recorder.Eventf(ref, r.node, eventType, reason, reason, "%s", note)
}
