package seatledger

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// RewriteSpecs writes again the specs of held claims whose entries a
// prepare of other claims combined (Reservation.Widened), each under its
// claim's lock, from its entry as recorded now; a claim released or
// fenced meanwhile is skipped. Call it after the reservation's Done: a
// prepare holds its own claims' locks, and another may hold these.
func (l *Ledger) RewriteSpecs(ctx context.Context, uids []types.UID) error {
	var failed []string
	for _, uid := range uids {
		if err := l.rewriteSpec(uid); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot write again the CDI spec of a claim now held beside another in one container", "uid", uid)
			failed = append(failed, fmt.Sprintf("%s: %v", uid, err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("write again the CDI specs of claims a container holds beside this one: %s", strings.Join(failed, "; "))
	}
	return nil
}

func (l *Ledger) rewriteSpec(uid types.UID) error {
	defer l.claims.lock([]types.UID{uid})()
	l.rec.mu.Lock()
	var c *checkpoint.Claim
	if l.rec.st != nil {
		if e := l.rec.st.Claims[uid]; e != nil && !e.Fenced() && e.Phase == checkpoint.PrepareCompleted {
			copied := *e
			c = &copied
		}
	}
	l.rec.mu.Unlock()
	if c == nil {
		return nil
	}
	return l.opts.Specs.Write(uid, c)
}
