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
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatkind"
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
	start := d.opts.Clock.Now()
	defer func() { d.metrics.observePrepare(d.opts.Clock.Since(start), len(claims)) }()
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
	d *Driver
	r *seatledger.Reservation
	seatledger.Outcome
	// write says the claim's spec is written: it is fresh, or what it
	// says is not what the node has (why).
	write bool
	why   string
	// plan is the claim's spec, planned once.
	plan *specPlan
}

// step is one step of a claim's route; kind counts its failures
// (kyb_dra_errors_total), where the error does not say (seatkind).
type step struct {
	kind string
	run  func(c *claimRoute, ctx context.Context) error
}

// route are the steps every claim takes, in order, whatever its devices:
// the seat kinds do their part at each. The first step that fails fails
// the claim, through one path (claimRoute.failed); its seats stay
// recorded for the kubelet's retry, or its unprepare.
var route = []step{
	{"claim", (*claimRoute).recorded},
	{"claim", (*claimRoute).verify},
	{"", (*claimRoute).prepareHardware},
	{"cdi", (*claimRoute).planSpec},
	{"cdi", (*claimRoute).writeSpec},
}

// prepareClaim takes one claim of a call through its route.
func (d *Driver) prepareClaim(ctx context.Context, r *seatledger.Reservation, o seatledger.Outcome) kubeletplugin.PrepareResult {
	c := &claimRoute{d: d, r: r, Outcome: o, write: o.State == seatledger.Fresh}
	for _, s := range route {
		if err := s.run(c, ctx); err != nil {
			return c.failed(ctx, s.kind, err)
		}
	}
	return c.prepared(ctx)
}

// recorded passes on the ledger's refusal of the claim, which names it.
func (c *claimRoute) recorded(context.Context) error {
	return c.Err
}

// verify decides whether the spec of a claim recorded before is written
// again: where it is gone (the CDI directory is a tmpfs that a reboot
// empties), where the claim is combined with another now, or where a seat
// kind finds hardware gone that the spec names (a MIG instance, made
// again by the prepare: the spec names the new one). A repeated prepare
// finds none of these, most of the time, and is answered at once.
func (c *claimRoute) verify(ctx context.Context) error {
	if c.State == seatledger.Fresh {
		return nil
	}
	uid := c.Claim.UID
	exists := c.d.specs.Exists(uid)
	var gone []string
	for _, k := range c.d.kinds.list() {
		gone = append(gone, k.Verify(ctx, uid, c.Entry, exists)...)
	}
	switch {
	case len(gone) > 0:
		c.why = fmt.Sprintf("rewrite CDI spec for hardware made again (%s)", strings.Join(gone, ", "))
	case c.State == seatledger.SpecOwed:
		c.why = "rewrite CDI spec for a combined claim"
	case !exists:
		c.why = "restore CDI spec"
	}
	c.write = c.why != ""
	return nil
}

// prepareHardware has every seat kind ready the hardware for the claim's
// devices of its kind.
func (c *claimRoute) prepareHardware(ctx context.Context) error {
	if !c.write {
		return nil
	}
	for _, k := range c.d.kinds.list() {
		if err := k.Prepare(ctx, c.Claim.UID, c.Entry); err != nil {
			return err
		}
	}
	return nil
}

// planSpec plans the claim's spec, for the spec to write and for the
// device metadata of the answer.
func (c *claimRoute) planSpec(context.Context) error {
	if !c.write && !c.d.opts.DeviceMetadata {
		return nil
	}
	p, err := c.d.specs.plan(c.Claim.UID, c.Entry)
	c.plan = p
	return c.specError(err)
}

// writeSpec writes the claim's spec and confirms that the claim still
// holds its seats.
func (c *claimRoute) writeSpec(ctx context.Context) error {
	if !c.write {
		return nil
	}
	uid := c.Claim.UID
	err := c.d.specs.write(uid, c.Entry, c.plan)
	if err == nil {
		err = c.r.Confirm(ctx, uid)
	}
	return c.specError(err)
}

// specError says what was being done to the claim's spec.
func (c *claimRoute) specError(err error) error {
	switch {
	case err == nil:
		return nil
	case c.why != "":
		return fmt.Errorf("%s: %w", c.why, err)
	}
	return fmt.Errorf("write the claim's CDI spec: %w", err)
}

// prepared answers a claim whose route is done, and says so: a fresh
// claim's status is queued and its Prepared event recorded.
func (c *claimRoute) prepared(ctx context.Context) kubeletplugin.PrepareResult {
	d, logger, uid := c.d, klog.FromContext(ctx), c.Claim.UID
	switch {
	case c.State == seatledger.Fresh:
		d.hooks.run(HookAfterCDIWrite)
		d.statuses.queueAfterPrepare(uid)
		logger.V(2).Info("Prepared claim", "claim", klog.KObj(c.Claim), "uid", uid, "seats", seatledger.DescribeSeats(c.Entry))
		d.events.Claim(ctx, c.Claim, corev1.EventTypeNormal, nodeevents.ReasonPrepared, describePrepared(c.Entry, d.opts.NodeName))
	case c.write:
		logger.Info("Wrote the CDI spec of a prepared claim again", "claim", klog.KObj(c.Claim), "uid", uid, "why", c.why)
	}
	return d.result(uid, c.Entry, c.plan)
}

// failed is the one way a claim fails: counted by the step's kind (the
// seat kind's where the error says; checkpoint while the checkpoint is
// lost), logged, told to the claim's users in an Event, and answered
// with an error that names the claim. The claim's seats stay recorded for
// the kubelet's retry, or its unprepare.
func (c *claimRoute) failed(ctx context.Context, kind string, err error) kubeletplugin.PrepareResult {
	d, claim := c.d, c.Claim
	kind = kindOf(err, kind)
	d.metrics.prepareError(kind)
	klog.FromContext(ctx).Error(err, "Cannot prepare claim", "claim", klog.KObj(claim), "uid", claim.UID, "step", kind)
	d.events.Claim(ctx, claim, corev1.EventTypeWarning, nodeevents.ReasonPrepareFailed, err.Error())
	if c.State != seatledger.Refused {
		// The ledger's refusals name the claim already.
		err = fmt.Errorf("prepare claim %s/%s (%s): %w", claim.Namespace, claim.Name, claim.UID, err)
	}
	return kubeletplugin.PrepareResult{Err: err}
}

// kindOf is the kind of error err says it is (kyb_dra_errors_total's
// label), or otherwise.
func kindOf(err error, otherwise string) string {
	switch {
	case errors.Is(err, seatledger.ErrCheckpointLost):
		return "checkpoint"
	case errors.Is(err, seatkind.ErrMIG):
		return "mig"
	case errors.Is(err, seatkind.ErrSharing):
		return "sharing"
	}
	return otherwise
}

// result is the answer for a prepared claim: its devices' CDI IDs and,
// with device metadata on, what a container learns of each (plan).
func (d *Driver) result(uid types.UID, c *checkpoint.Claim, plan *specPlan) kubeletplugin.PrepareResult {
	var r kubeletplugin.PrepareResult
	for _, dev := range c.Devices {
		kd := kubeletplugin.Device{Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device, CDIDeviceIDs: d.specs.ids(uid, dev)}
		if dev.ShareID != "" {
			share := types.UID(dev.ShareID)
			kd.ShareID = &share
		}
		if d.opts.DeviceMetadata {
			kd.Metadata = metadataOf(d.node, dev, plan)
		}
		r.Devices = append(r.Devices, kd)
	}
	return r
}

// describePrepared says where a claim's seats are, for its Prepared event:
// "seat 2 (generation 7) of G0 (g0-1x: GPU 0) on node-1", with a sized
// seat's size: "seat 2 (generation 7; 20Gi per GPU, 25 % of SMs)".
func describePrepared(c *checkpoint.Claim, nodeName string) string {
	var parts []string
	for _, dev := range c.Devices {
		var seats []string
		for i, s := range dev.Seats {
			if sz := dev.Size; sz != nil {
				seats = append(seats, fmt.Sprintf("%d (generation %d; %s per GPU, %d %% of SMs)", s, dev.Generations[i], resource.NewQuantity(sz.MemoryBytes, resource.BinarySI), sz.ComputePercent))
				continue
			}
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
	return strings.Join(parts, "; ") + " on " + nodeName
}

// The device metadata's own attributes, besides those the slices publish.
const (
	metaSeats       = "seats"
	metaGenerations = "seatGenerations"
	metaGPUUUIDs    = "gpuUUIDs"
	metaAdminAccess = "adminAccess"
	// The sharing of the device's group: its strategy and, for MPS, the
	// share the container taking its request gets (the request's seats of
	// the group's).
	metaSharing      = "sharing"
	metaMPSThreadPct = "mpsActiveThreadPercentage"
	metaMPSMemMiB    = "mpsPinnedDeviceMemLimitMiB"
	// A sized seat's size, the device's own (its request's MPS limits
	// add up the sizes of the request's seats): memory in bytes on each
	// GPU of its group, and per cent of their SMs.
	metaSeatMemory  = "seatMemory"
	metaSeatCompute = "seatCompute"
)

// metadata is what a container learns of a prepared device from its
// metadata file: the attributes its slice publishes for the group, the
// seats it holds there with their generations (lists of integers, in the
// order of KYB_GPU_SEAT and KYB_SEAT_GEN) and the group's GPU UUIDs (a list
// of strings, in the order of its gpuIndices). The MPS share is the one
// the claim's spec gives (plan).
func metadataOf(node draresources.Node, dev checkpoint.Device, plan *specPlan) *kubeletplugin.DeviceMetadata {
	attrs := map[string]resourceapi.DeviceAttribute{}
	if ref, ok := node.Index[dev.GroupDevice]; ok {
		for name, v := range draresources.Attributes(ref.Group, node.Inv, node.Plan.Attributes) {
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
	if sz := dev.Size; sz != nil {
		memory, compute := sz.MemoryBytes, sz.ComputePercent
		attrs[metaSeatMemory] = resourceapi.DeviceAttribute{IntValue: &memory}
		attrs[metaSeatCompute] = resourceapi.DeviceAttribute{IntValue: &compute}
	}
	if g := node.Group(dev.GroupDevice); g != nil {
		strategy := string(g.Profile.Sharing)
		attrs[metaSharing] = resourceapi.DeviceAttribute{StringValue: &strategy}
		if r := plan.request(dev); r != nil && r.Options.MPS != nil && len(dev.Seats) > 0 {
			pct := int64(r.Options.MPS.ActiveThreadPercentage)
			attrs[metaMPSThreadPct] = resourceapi.DeviceAttribute{IntValue: &pct}
			attrs[metaMPSMemMiB] = resourceapi.DeviceAttribute{IntValues: slices.Clone(r.Options.MPS.PinnedMemMiB)}
		}
	}
	return &kubeletplugin.DeviceMetadata{Attributes: attrs}
}
