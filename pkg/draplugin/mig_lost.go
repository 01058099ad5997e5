package draplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// Lost MIG instances: the instance of a held claim's MIG device can go
// without the plugin. Someone destroys it (nvidia-smi mig -dci -dgi,
// another tool) or only its compute instance, or a GPU reset takes it.
// Its containers lose their GPU; a new pod must not be promised it. The
// plugin notices it
//
//   - while it runs, by checking the journal's instances against NVML
//     every MIG.CheckInterval (miginstance.Manager.Gone);
//   - at start, where the journal no longer names the instance of a
//     prepared claim whose CDI spec is on the node (Reconcile forgot the
//     record of the gone instance, at this start or an earlier one);
//   - at a repeated prepare of the claim, which checks its instances.
//
// and reports it once per plugin run: an error log line, a Warning event
// MIGInstanceGone on the Node and on the claim, a condition
// MIGInstanceGone on the device's entry in the claim's status (its
// migDeviceUUID emptied), the device Unhealthy on the kubelet's health
// stream, and a taint gpu.kyb.ai/unhealthy=mig-instance-gone:NoSchedule on
// the device until the claim is released.
//
// The claim's next prepare (the kubelet's, after a kubelet restart or a
// reboot) makes the instance again at the same placement, as after a
// reboot, and rewrites the claim's spec with the new MIG device: the
// allocation still names that device, and its containers can only start
// again on a live one. That removes the taint and the condition, with a
// Normal event MIGInstanceMadeAgain. Where the placement is taken (an
// administrator made an instance there) the prepare fails naming it, and
// the device stays tainted until the claim is released.
//
// A claim whose spec is not on the node is left out: its containers
// cannot run on the instance that went. After a reboot the CDI specs are
// gone with the instances, and the prepares that follow make them again
// without a report.

// conditionMIGInstanceGone is the condition type on the status entry of a
// device whose MIG instance is gone.
const conditionMIGInstanceGone = "MIGInstanceGone"

// migInstanceGone is the taint value of a device whose MIG instance is
// gone.
const migInstanceGone = "mig-instance-gone"

// defaultMIGCheckInterval is how often the instances of held claims are
// checked against NVML by default: a few NVML calls per instance, under
// the journal's lock.
const defaultMIGCheckInterval = 30 * time.Second

// lostKey is one device of one claim.
type lostKey struct {
	claim  types.UID
	device string
}

// lostInstance is the gone instance of a held claim's MIG device.
type lostInstance struct {
	namespace, name string
	device          string
	// instance says which instance went, for people.
	instance string
	since    time.Time
}

// note says what went and what follows, for events, conditions and the
// health stream.
func (li lostInstance) note() string {
	return fmt.Sprintf("%s of claim %s/%s (device %s) is gone: destroyed outside the plugin, or taken by a GPU reset. The device is tainted %s=%s:%s until the claim is released; the claim's next prepare makes the instance again",
		li.instance, li.namespace, li.name, li.device, draresources.TaintKey, migInstanceGone, resourceapi.DeviceTaintEffectNoSchedule)
}

// lostInstances are the lost instances of held claims.
type lostInstances struct {
	// checking serialises a check of the instances with a repeated
	// prepare that makes one again: a check that found an instance gone
	// must not report it after the prepare made it again.
	checking sync.Mutex

	mu sync.Mutex
	m  map[lostKey]lostInstance
}

// add records k; false where it was recorded already.
func (l *lostInstances) add(k lostKey, li lostInstance) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[k]; ok {
		return false
	}
	if l.m == nil {
		l.m = map[lostKey]lostInstance{}
	}
	l.m[k] = li
	return true
}

// drop forgets the keys for which gone says so, and returns them.
func (l *lostInstances) drop(gone func(lostKey) bool) []lostKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []lostKey
	for k := range l.m {
		if gone(k) {
			out = append(out, k)
			delete(l.m, k)
		}
	}
	return out
}

func (l *lostInstances) get(k lostKey) (lostInstance, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	li, ok := l.m[k]
	return li, ok
}

// byDevice maps each device with a lost instance to it.
func (l *lostInstances) byDevice() map[string]lostInstance {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]lostInstance, len(l.m))
	for k, li := range l.m {
		out[k.device] = li
	}
	return out
}

// lostDevice says whether the instance of a claim's device is lost.
func (s *migSeats) lostDevice(uid types.UID, device string) (lostInstance, bool) {
	if s == nil {
		return lostInstance{}, false
	}
	return s.lost.get(lostKey{uid, device})
}

// describeRecord names a journal record's instance.
func describeRecord(r miginstance.Record) string {
	return fmt.Sprintf("MIG %s instance %s (GPU instance %d) at %s of GPU %d", r.Profile, r.UUID, r.GI, r.Placement(), r.GPU)
}

// describePlanned names the instance a MIG device stands for, where the
// journal no longer says which it was.
func describePlanned(w miginstance.Want) string {
	return fmt.Sprintf("MIG %s instance at %s of GPU %d", w.Profile.Name, w.Placement, w.GPU)
}

// lostAtStart finds, before the kubelet can call, the MIG devices of
// prepared claims whose instance the journal no longer names while their
// spec is on the node, and reports them.
func (d *Driver) lostAtStart(ctx context.Context) {
	if d.mig.instances == nil {
		return
	}
	held := d.ledger.PreparedClaims()
	for _, uid := range slices.Sorted(maps.Keys(held)) {
		c := held[uid]
		if c.Fenced() || !d.specs.Exists(uid) {
			continue
		}
		for _, dev := range c.Devices {
			w, ok := d.mig.want(uid, dev)
			if !ok {
				continue
			}
			if _, made, err := d.mig.instances.Lookup(uid, dev.Device); err != nil || made {
				continue
			}
			d.reportLost(ctx, uid, c, dev.Device, describePlanned(w))
		}
	}
}

// checkLost checks the instances of the held claims against NVML and
// reports those gone. It forgets the lost instances of claims released
// since (a stale claim's release does not go through an unprepare), and
// those that the journal names again, whole: made again by a prepare.
func (d *Driver) checkLost(ctx context.Context) {
	d.mig.lost.checking.Lock()
	defer d.mig.lost.checking.Unlock()
	gone, err := d.mig.instances.Gone(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot check every MIG instance of the held claims; checked again later")
	}
	held := d.ledger.PreparedClaims()
	stillGone := map[lostKey]bool{}
	for _, r := range gone {
		stillGone[lostKey{r.Claim, r.Device}] = true
		if c, ok := held[r.Claim]; ok && d.specs.Exists(r.Claim) {
			d.reportLost(ctx, r.Claim, c, r.Device, describeRecord(r))
		}
	}
	dropped := d.mig.lost.drop(func(k lostKey) bool {
		if held[k.claim] == nil {
			return true
		}
		if err != nil || stillGone[k] {
			return false
		}
		_, made, lerr := d.mig.instances.Lookup(k.claim, k.device)
		return lerr == nil && made
	})
	for _, k := range dropped {
		if held[k.claim] != nil {
			d.statuses.rewrite(k.claim)
		}
	}
	if len(dropped) > 0 {
		d.publisher.nudge()
	}
}

// watchLost checks the held claims' MIG instances every interval until
// ctx ends.
func (d *Driver) watchLost(ctx context.Context, interval time.Duration) {
	t := d.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			d.checkLost(ctx)
		}
	}
}

// lostOnPrepare finds, at a repeated prepare of a held claim, which of
// its MIG devices' instances are gone: known already, not named by the
// journal while the claim's spec is on the node (specExists), or not
// whole on the GPU. It reports those not known yet. Where the claim has
// MIG devices, no check of the instances runs until done is called,
// after the prepare made them again.
func (d *Driver) lostOnPrepare(ctx context.Context, uid types.UID, c *checkpoint.Claim, specExists bool) (lost []string, done func()) {
	done = func() {}
	if d.mig.instances == nil || !slices.ContainsFunc(c.Devices, func(dev checkpoint.Device) bool { _, ok := d.mig.want(uid, dev); return ok }) {
		return nil, done
	}
	d.mig.lost.checking.Lock()
	done = d.mig.lost.checking.Unlock
	var check bool
	for _, dev := range c.Devices {
		w, ok := d.mig.want(uid, dev)
		if !ok {
			continue
		}
		if _, known := d.mig.lostDevice(uid, dev.Device); known {
			lost = append(lost, dev.Device)
			continue
		}
		_, made, err := d.mig.instances.Lookup(uid, dev.Device)
		switch {
		case err != nil:
			// The prepare that follows reports it.
		case made:
			check = true
		case specExists:
			d.reportLost(ctx, uid, c, dev.Device, describePlanned(w))
			lost = append(lost, dev.Device)
		}
	}
	if !check {
		return lost, done
	}
	gone, err := d.mig.instances.Gone(ctx, uid)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot check the claim's MIG instances", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
	}
	for _, r := range gone {
		if !slices.Contains(lost, r.Device) {
			d.reportLost(ctx, uid, c, r.Device, describeRecord(r))
			lost = append(lost, r.Device)
		}
	}
	return lost, done
}

// reportLost records that the instance of a held claim's device is gone
// and, the first time, says so: log line, events on the Node and the
// claim, the claim's status, the device's taint (publish) and its health.
func (d *Driver) reportLost(ctx context.Context, uid types.UID, c *checkpoint.Claim, device, instance string) {
	li := lostInstance{namespace: c.Namespace, name: c.Name, device: device, instance: instance, since: d.clock.Now()}
	if !d.mig.lost.add(lostKey{uid, device}, li) {
		return
	}
	klog.FromContext(ctx).Error(nil, "The MIG instance of a held claim's device is gone; the device is tainted until the claim is released, and the claim's next prepare makes the instance again",
		"claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "device", device, "instance", instance)
	note := li.note()
	d.events.Warning(ctx, nodeevents.ReasonMIGInstanceGone, note)
	d.events.Claim(ctx, claimRef(uid, c), corev1.EventTypeWarning, nodeevents.ReasonMIGInstanceGone, note)
	d.statuses.rewrite(uid)
	d.publisher.nudge()
}

// madeAgain forgets the lost instances of a claim's devices that its
// prepare made again, and says so.
func (d *Driver) madeAgain(ctx context.Context, uid types.UID, c *checkpoint.Claim, devices []string) {
	dropped := d.mig.lost.drop(func(k lostKey) bool { return k.claim == uid && slices.Contains(devices, k.device) })
	if len(dropped) == 0 {
		return
	}
	for _, k := range dropped {
		note := fmt.Sprintf("The MIG instance of claim %s/%s (device %s) that was gone is made again; the device's taint is removed", c.Namespace, c.Name, k.device)
		d.events.Normal(ctx, nodeevents.ReasonMIGInstanceMadeAgain, note)
		d.events.Claim(ctx, claimRef(uid, c), corev1.EventTypeNormal, nodeevents.ReasonMIGInstanceMadeAgain, note)
	}
	d.statuses.rewrite(uid)
	d.publisher.nudge()
}

// releasedLost forgets the lost instances of released claims.
func (d *Driver) releasedLost(uids []types.UID) {
	if d.mig.instances == nil || len(uids) == 0 {
		return
	}
	if dropped := d.mig.lost.drop(func(k lostKey) bool { return slices.Contains(uids, k.claim) }); len(dropped) > 0 {
		d.publisher.nudge()
	}
}

// claimRef is a claim for its events.
func claimRef(uid types.UID, c *checkpoint.Claim) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, UID: uid}}
}

// taintLost taints the devices of res whose MIG instance is gone. A
// device tainted under the key already (its GPU or its instance is
// unhealthy) keeps that taint alone.
func taintLost(res resourceslice.DriverResources, lost map[string]lostInstance) {
	if len(lost) == 0 {
		return
	}
	taints := make(map[string]resourceapi.DeviceTaint, len(lost))
	for device := range lost {
		taints[device] = resourceapi.DeviceTaint{Key: draresources.TaintKey, Value: migInstanceGone, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	}
	draresources.TaintDevices(res, taints)
}
