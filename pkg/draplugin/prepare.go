package draplugin

import (
	"context"
	"errors"
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
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, o := range r.Claims {
		results[o.Claim.UID] = d.prepareClaim(ctx, r, o)
	}
	// Held claims a container of this call's pod holds beside one of its
	// claims get their specs written again before the call answers.
	if err := r.Finish(ctx); err != nil {
		d.metrics.prepareError("cdi")
		for uid, res := range results {
			if res.Err == nil {
				results[uid] = kubeletplugin.PrepareResult{Err: err}
			}
		}
	}
	return results, nil
}

// claimRoute is one claim on its way through the prepare: the ledger's
// answer, and what its steps learned.
type claimRoute struct {
	r *seatledger.Reservation
	seatledger.Outcome
	// why the spec of a claim recorded before is written again; "" where
	// it is not (the claim is fresh, or its spec is current).
	why string
	// lost are the claim's MIG devices whose instance was gone (made
	// again by this prepare).
	lost []string
	// release ends what the steps hold until the claim is answered.
	release func()
}

// step is one step of a claim's route; kind counts its failures
// (kyb_dra_errors_total). answered ends the route early: the claim's
// prepare is answered as it stands.
type step struct {
	kind string
	run  func(d *Driver, ctx context.Context, c *claimRoute) (answered bool, err error)
}

// route are the steps every claim takes, in order. The first that fails
// fails the claim, through one path (prepareFailed); its seats stay
// recorded for the kubelet's retry, or its unprepare.
var route = []step{
	{"claim", (*Driver).recorded},
	{"mig", (*Driver).current},
	{"mig", (*Driver).prepareMIG},
	{"sharing", (*Driver).prepareSharing},
	{"cdi", (*Driver).writeSpec},
}

// prepareClaim takes one claim of a call through its route.
func (d *Driver) prepareClaim(ctx context.Context, r *seatledger.Reservation, o seatledger.Outcome) kubeletplugin.PrepareResult {
	c := &claimRoute{r: r, Outcome: o, release: func() {}}
	defer func() { c.release() }()
	for _, s := range route {
		answered, err := s.run(d, ctx, c)
		if err != nil {
			return d.prepareFailed(ctx, c, s.kind, err)
		}
		if answered {
			return d.result(o.Claim.UID, o.Entry)
		}
	}
	return d.prepared(ctx, c)
}

// recorded passes on the ledger's refusal of the claim, which names it.
func (d *Driver) recorded(_ context.Context, c *claimRoute) (bool, error) {
	return false, c.Err
}

// current answers at once a claim recorded before whose spec is on the
// node and whose MIG instances are there, as a repeated prepare finds
// most. Otherwise it says why the spec is written again: it is gone (the
// CDI directory is a tmpfs that a reboot empties), the claim is combined
// with another now, or a MIG instance went and is made again (the spec
// names the new one; mig_lost.go).
func (d *Driver) current(ctx context.Context, c *claimRoute) (bool, error) {
	if c.State == seatledger.Fresh {
		return false, nil
	}
	uid := c.Claim.UID
	exists := d.specs.Exists(uid)
	c.lost, c.release = d.lostOnPrepare(ctx, uid, c.Entry, exists)
	switch {
	case len(c.lost) > 0:
		c.why = "rewrite CDI spec for a MIG instance made again"
	case c.State == seatledger.SpecOwed:
		c.why = "rewrite CDI spec for a combined claim"
	case exists:
		return true, nil
	default:
		c.why = "restore CDI spec"
	}
	return false, nil
}

// prepareMIG makes the claim's MIG instances.
func (d *Driver) prepareMIG(ctx context.Context, c *claimRoute) (bool, error) {
	err := d.mig.prepare(ctx, c.Claim.UID, c.Entry)
	if err != nil && len(c.lost) > 0 {
		err = fmt.Errorf("the MIG instance of %s is gone and cannot be made again (the device stays tainted until the claim is released): %w", strings.Join(c.lost, ", "), err)
	}
	return false, err
}

// prepareSharing readies the sharing of the claim's groups.
func (d *Driver) prepareSharing(ctx context.Context, c *claimRoute) (bool, error) {
	return false, d.sharing.prepare(ctx, c.Entry)
}

// writeSpec writes the claim's spec and confirms that the claim still
// holds its seats.
func (d *Driver) writeSpec(ctx context.Context, c *claimRoute) (bool, error) {
	uid := c.Claim.UID
	err := d.specs.Write(uid, c.Entry)
	if err == nil {
		err = c.r.Confirm(ctx, uid)
	}
	switch {
	case err == nil:
		return false, nil
	case c.why != "":
		return false, fmt.Errorf("%s: %w", c.why, err)
	}
	return false, fmt.Errorf("write the claim's CDI spec: %w", err)
}

// prepared answers a claim whose route is done, and says so: a fresh
// claim's status is queued and its Prepared event recorded.
func (d *Driver) prepared(ctx context.Context, c *claimRoute) kubeletplugin.PrepareResult {
	logger := klog.FromContext(ctx)
	uid := c.Claim.UID
	if c.State == seatledger.Fresh {
		d.hooks.run(HookAfterCDIWrite)
		d.statuses.queueAfterPrepare(uid)
		logger.V(2).Info("Prepared claim", "claim", klog.KObj(c.Claim), "uid", uid, "seats", seatledger.DescribeSeats(c.Entry))
		d.events.Claim(ctx, c.Claim, corev1.EventTypeNormal, nodeevents.ReasonPrepared, d.describePrepared(c.Entry))
	} else {
		logger.Info("Wrote the CDI spec of a prepared claim again", "claim", klog.KObj(c.Claim), "uid", uid, "why", c.why)
		d.madeAgain(ctx, uid, c.Entry, c.lost)
	}
	return d.result(uid, c.Entry)
}

// prepareFailed is the one way a claim fails: counted by the step's kind
// (checkpoint while the checkpoint is lost), logged, told to the claim's
// users in an Event, and answered with an error that names the claim.
// The claim's seats stay recorded for the kubelet's retry, or its
// unprepare.
func (d *Driver) prepareFailed(ctx context.Context, c *claimRoute, kind string, err error) kubeletplugin.PrepareResult {
	claim := c.Claim
	if errors.Is(err, seatledger.ErrCheckpointLost) {
		kind = "checkpoint"
	}
	d.metrics.prepareError(kind)
	klog.FromContext(ctx).Error(err, "Cannot prepare claim", "claim", klog.KObj(claim), "uid", claim.UID, "step", kind)
	d.events.Claim(ctx, claim, corev1.EventTypeWarning, nodeevents.ReasonPrepareFailed, err.Error())
	if c.State != seatledger.Refused {
		// The ledger's refusals name the claim already.
		err = fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)
	}
	return kubeletplugin.PrepareResult{Err: err}
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
