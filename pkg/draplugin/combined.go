package draplugin

import (
	"context"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

// besideStandalone finds the claims of a prepare call whose pod also
// references a standalone claim the node holds: the kubelet leaves that
// one out of the call, having prepared it for another pod, yet one of the
// pod's containers may hold both. Only a call of one claim needs asking
// (several claims in a call are combined anyway), and only on a node
// holding standalone claims: one GET of each of those. A claim that cannot
// be read counts as referenced, so the specs err on the side that is
// right for every container.
func (d *Driver) besideStandalone(ctx context.Context, claims []*resourceapi.ResourceClaim) map[types.UID]bool {
	if len(claims) != 1 {
		return nil
	}
	claim := claims[0]
	// A claim any pod may hold is combined anyway.
	if seatledger.Standalone(claim) {
		return nil
	}
	pods := seatledger.ReservingPods(claim)
	if len(pods) == 0 {
		return nil
	}
	held, err := d.ledger.StandaloneClaims(ctx)
	if err != nil || len(held) == 0 {
		// The reservation reports a checkpoint that cannot be read.
		return nil
	}
	logger := klog.FromContext(ctx)
	for _, h := range held {
		// A pod references claims of its own namespace only.
		if h.Namespace != claim.Namespace || h.Name == claim.Name {
			continue
		}
		s, err := d.opts.Client.ResourceV1().ResourceClaims(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // gone: no pod references it now
		}
		if err != nil {
			logger.Info("Cannot read a standalone claim the node holds; preparing the claim as if its pod referenced it", "standalone", klog.KRef(h.Namespace, h.Name), "claim", klog.KObj(claim), "err", err)
			return map[types.UID]bool{claim.UID: true}
		}
		if slices.ContainsFunc(seatledger.ReservingPods(s), func(uid types.UID) bool { return slices.Contains(pods, uid) }) {
			logger.V(2).Info("The claim's pod also references a standalone claim the node holds: its containers may hold both", "claim", klog.KObj(claim), "standalone", klog.KObj(s))
			return map[types.UID]bool{claim.UID: true}
		}
	}
	return nil
}
