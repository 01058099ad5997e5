package draplugin

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
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
// save (seatledger.Reserve). A bad claim fails its own result; only an
// unreadable or unwritable checkpoint fails the call.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	d.hooks.run(HookPrepareStart)
	d.metrics.observePrepareStart()
	start := d.clock.Now()
	defer func() { d.metrics.observePrepare(d.clock.Since(start), len(claims)) }()
	r := d.ledger.ReserveFor(ctx, claims, d.holders.Holders(ctx, claims))
	defer r.Done()
	if r.Err != nil {
		d.metrics.prepareError("checkpoint")
		for _, claim := range claims {
			d.events.Claim(ctx, claim, corev1.EventTypeWarning, nodeevents.ReasonPrepareFailed, r.Err.Error())
		}
		return nil, r.Err
	}
	results := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		if err := r.Errs[claim.UID]; err != nil {
			if r.Lost {
				d.metrics.prepareError("checkpoint")
			} else {
				d.metrics.prepareError("claim")
			}
			results[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			d.events.Claim(ctx, claim, corev1.EventTypeWarning, nodeevents.ReasonPrepareFailed, err.Error())
			continue
		}
		c := r.Entries[claim.UID]
		if !r.Fresh[claim.UID] {
			results[claim.UID] = d.completedResult(ctx, r, claim.UID, c)
			continue
		}
		if err := d.mig.prepare(ctx, claim.UID, c); err != nil {
			// The seat stays recorded for the kubelet's retry, which
			// makes the instance, or its unprepare.
			d.metrics.prepareError("mig")
			logger.Error(err, "Cannot make the claim's MIG instance", "claim", klog.KObj(claim))
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)}
			d.events.Claim(ctx, claim, corev1.EventTypeWarning, nodeevents.ReasonPrepareFailed, err.Error())
			continue
		}
		if err := d.sharing.prepare(ctx, c); err != nil {
			// As for a spec that cannot be written: the seats stay
			// recorded for the kubelet's retry or its unprepare.
			d.metrics.prepareError("sharing")
			logger.Error(err, "Cannot share the claim's GPUs as its profile says", "claim", klog.KObj(claim))
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)}
			d.events.Claim(ctx, claim, corev1.EventTypeWarning, nodeevents.ReasonPrepareFailed, err.Error())
			continue
		}
		if err := d.writeSpec(ctx, r, claim.UID, c); err != nil {
			// The seats stay recorded: the kubelet retries the prepare,
			// which writes the spec, or unprepares the claim.
			d.metrics.prepareError("cdi")
			logger.Error(err, "Cannot write CDI spec", "claim", klog.KObj(claim))
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)}
			d.events.Claim(ctx, claim, corev1.EventTypeWarning, nodeevents.ReasonPrepareFailed, "write the claim's CDI spec: "+err.Error())
			continue
		}
		d.hooks.run(HookAfterCDIWrite)
		d.statuses.queueAfterPrepare(claim.UID)
		results[claim.UID] = d.result(claim.UID, c)
		logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "uid", claim.UID, "seats", seatledger.DescribeSeats(c))
		d.events.Claim(ctx, claim, corev1.EventTypeNormal, nodeevents.ReasonPrepared, d.describePrepared(c))
	}
	d.rewriteWidened(ctx, r, results)
	return results, nil
}

// rewriteWidened writes again, before the call answers, the specs of held
// claims that a container of this call's pod holds beside one of its
// claims. If one cannot be written, the call's claims fail: the kubelet
// prepares them again, which tries again.
func (d *Driver) rewriteWidened(ctx context.Context, r *seatledger.Reservation, results map[types.UID]kubeletplugin.PrepareResult) {
	if len(r.Widened) == 0 {
		return
	}
	// Another prepare may hold those claims' locks and want these.
	r.Done()
	err := d.ledger.RewriteSpecs(ctx, r.Widened)
	if err == nil {
		return
	}
	d.metrics.prepareError("cdi")
	for uid, res := range results {
		if res.Err == nil {
			results[uid] = kubeletplugin.PrepareResult{Err: err}
		}
	}
}

// completedResult answers a repeated prepare: the recorded seats and CDI
// IDs. The spec is written again if it is gone (the CDI directory is a
// tmpfs that a reboot empties) or the claim is combined with another now.
func (d *Driver) completedResult(ctx context.Context, r *seatledger.Reservation, uid types.UID, c *checkpoint.Claim) kubeletplugin.PrepareResult {
	// A combined claim's spec names GPUs as every spec of its containers
	// does; a missing one is written back. Sharing first: a first prepare
	// may have failed there. A MIG instance that went is made again, and
	// the spec names the new one (mig_lost.go).
	why := "rewrite CDI spec for a combined claim"
	exists := d.specs.Exists(uid)
	lost, done := d.lostOnPrepare(ctx, uid, c, exists)
	defer done()
	switch {
	case len(lost) > 0:
		why = "rewrite CDI spec for a MIG instance made again"
	case r.Rewrite[uid]:
		// why says so.
	case exists:
		return d.result(uid, c)
	default:
		why = "restore CDI spec"
	}
	if err := d.mig.prepare(ctx, uid, c); err != nil {
		if len(lost) > 0 {
			err = fmt.Errorf("the MIG instance of %s is gone and cannot be made again (the device stays tainted until the claim is released): %w", strings.Join(lost, ", "), err)
		}
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %w", c.Namespace, c.Name, uid, err)}
	}
	if err := d.sharing.prepare(ctx, c); err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %w", c.Namespace, c.Name, uid, err)}
	}
	if err := d.writeSpec(ctx, r, uid, c); err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s (%s): %s: %w", c.Namespace, c.Name, uid, why, err)}
	}
	klog.FromContext(ctx).Info("Wrote the CDI spec of a prepared claim again", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "why", why)
	d.madeAgain(ctx, uid, c, lost)
	return d.result(uid, c)
}

// writeSpec writes a reserved claim's spec and confirms that the claim
// still holds its seats.
func (d *Driver) writeSpec(ctx context.Context, r *seatledger.Reservation, uid types.UID, c *checkpoint.Claim) error {
	if err := d.specs.Write(uid, c); err != nil {
		return err
	}
	return r.Confirm(ctx, uid)
}

func (d *Driver) result(uid types.UID, c *checkpoint.Claim) kubeletplugin.PrepareResult {
	var r kubeletplugin.PrepareResult
	for _, dev := range c.Devices {
		kd := kubeletplugin.Device{Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device, CDIDeviceIDs: d.specs.ids(uid, dev)}
		if dev.ShareID != "" {
			share := types.UID(dev.ShareID)
			kd.ShareID = &share
		}
		if d.opts.DeviceMetadata {
			kd.Metadata = d.metadata(dev)
		}
		r.Devices = append(r.Devices, kd)
	}
	return r
}

// describePrepared says where a claim's seats are, for its Prepared event:
// "seat 2 (generation 7) of G0 (g0-1x: GPU 0) on node-1".
func (d *Driver) describePrepared(c *checkpoint.Claim) string {
	var parts []string
	for _, dev := range c.Devices {
		var seats []string
		for i, s := range dev.Seats {
			seats = append(seats, fmt.Sprintf("%d (generation %d)", s, dev.Generations[i]))
		}
		what := "seat " + strings.Join(seats, ", ")
		if len(seats) > 1 {
			what = "seats " + strings.Join(seats, ", ")
		}
		switch {
		case dev.Fenced:
			what = "every seat (fenced)"
		case dev.AdminAccess:
			what = "admin access, no seat,"
		}
		gpus := make([]string, len(dev.GPUs))
		for i, x := range dev.GPUs {
			gpus[i] = strconv.Itoa(x)
		}
		parts = append(parts, fmt.Sprintf("%s of %s (%s: GPU %s)", what, dev.Group, dev.GroupDevice, strings.Join(gpus, ",")))
	}
	return strings.Join(parts, "; ") + " on " + d.opts.NodeName
}

// The device metadata's own attributes, besides those the slices publish.
const (
	metaSeats       = "seats"
	metaGenerations = "seatGenerations"
	metaGPUUUIDs    = "gpuUUIDs"
	metaAdminAccess = "adminAccess"
	// The sharing of the device's group: its strategy and, for MPS, the
	// device's own share (its seats of the group's).
	metaSharing      = "sharing"
	metaMPSThreadPct = "mpsActiveThreadPercentage"
	metaMPSMemMiB    = "mpsPinnedDeviceMemLimitMiB"
)

// metadata is what a container learns of a prepared device from its
// metadata file: the attributes its slice publishes for the group, the
// seats it holds there with their generations (lists of integers, in the
// order of KYB_GPU_SEAT and KYB_SEAT_GEN) and the group's GPU UUIDs (a list
// of strings, in the order of its gpuIndices).
func (d *Driver) metadata(dev checkpoint.Device) *kubeletplugin.DeviceMetadata {
	attrs := map[string]resourceapi.DeviceAttribute{}
	if ref, ok := d.node.Index[dev.GroupDevice]; ok {
		for name, v := range draresources.Attributes(ref.Group, d.node.Inv, d.node.Plan.Attributes) {
			attrs[string(name)] = v
		}
	}
	if len(dev.Seats) > 0 {
		seats := make([]int64, len(dev.Seats))
		for i, s := range dev.Seats {
			seats[i] = int64(s)
		}
		attrs[metaSeats] = resourceapi.DeviceAttribute{IntValues: seats}
		attrs[metaGenerations] = resourceapi.DeviceAttribute{IntValues: slices.Clone(dev.Generations)}
	}
	if len(dev.GPUUUIDs) > 0 {
		attrs[metaGPUUUIDs] = resourceapi.DeviceAttribute{StringValues: slices.Clone(dev.GPUUUIDs)}
	}
	if dev.AdminAccess {
		admin := true
		attrs[metaAdminAccess] = resourceapi.DeviceAttribute{BoolValue: &admin}
	}
	if g := d.node.Group(dev.GroupDevice); g != nil {
		strategy := string(g.Profile.Sharing)
		attrs[metaSharing] = resourceapi.DeviceAttribute{StringValue: &strategy}
		if g.Profile.Sharing == v1alpha1.SharingMPS && len(dev.Seats) > 0 {
			l := d.sharing.hw.Share(g, len(dev.Seats))
			pct := int64(l.ActiveThreadPercentage)
			attrs[metaMPSThreadPct] = resourceapi.DeviceAttribute{IntValue: &pct}
			attrs[metaMPSMemMiB] = resourceapi.DeviceAttribute{IntValues: l.PinnedMemMiB}
		}
	}
	return &kubeletplugin.DeviceMetadata{Attributes: attrs}
}

// UnprepareResourceClaims releases claims: their CDI specs go, their seats
// become free (their generations stay, so the next holder sees a new
// one). An unknown claim is already unprepared.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	start := d.clock.Now()
	// MIG instances go before their seats: a seat whose instance could
	// not be destroyed stays held, and the kubelet's retry destroys it.
	all := make([]types.UID, len(claims))
	for i, c := range claims {
		all[i] = c.UID
	}
	notDestroyed := d.mig.release(ctx, all)
	var uids []types.UID
	for _, uid := range all {
		if notDestroyed[uid] == nil {
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
	d.releasedLost(gone)
	d.sharing.settle(ctx, false)
	results := map[types.UID]error{}
	for _, claim := range claims {
		if err := notDestroyed[claim.UID]; err != nil {
			d.metrics.unprepareError("mig")
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
	d.metrics.observeUnprepare(d.clock.Since(start), len(claims))
	return results, nil
}
