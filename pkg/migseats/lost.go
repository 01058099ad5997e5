package migseats

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
	metaapply "k8s.io/client-go/applyconfigurations/meta/v1"
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
//     every CheckInterval (miginstance.Manager.Gone);
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
// reboot) makes the instance again at the same placement (Prepare), as after a
// reboot, and the plugin rewrites the claim's spec with the new MIG device: the
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

// ConditionInstanceGone is the condition type on the status entry of a
// device whose MIG instance is gone.
const ConditionInstanceGone = "MIGInstanceGone"

// instanceGone is the taint value of a device whose MIG instance is gone.
const instanceGone = "mig-instance-gone"

// defaultCheckInterval is how often the instances of held claims are
// checked against NVML by default: a few NVML calls per instance, under
// the journal's lock.
const defaultCheckInterval = 30 * time.Second

// lostKey is one device of one claim.
type lostKey struct {
	claim  types.UID
	device string
}

// Lost is the gone instance of a held claim's MIG device.
type Lost struct {
	namespace, name string
	device          string
	// instance says which instance went, for people.
	instance string
	// Since is when the plugin found it gone.
	Since time.Time
}

// Note says what went and what follows, for events, conditions and the
// health stream.
func (li Lost) Note() string {
	return fmt.Sprintf("%s of claim %s/%s (device %s) is gone: destroyed outside the plugin, or taken by a GPU reset. The device is tainted %s=%s:%s until the claim is released; the claim's next prepare makes the instance again",
		li.instance, li.namespace, li.name, li.device, draresources.TaintKey, instanceGone, resourceapi.DeviceTaintEffectNoSchedule)
}

// Condition is the status condition of the device whose instance is
// gone.
func (li Lost) Condition() *metaapply.ConditionApplyConfiguration {
	return metaapply.Condition().WithType(ConditionInstanceGone).WithStatus(metav1.ConditionTrue).
		WithReason(nodeevents.ReasonMIGInstanceGone).WithMessage(li.Note()).WithLastTransitionTime(metav1.NewTime(li.Since))
}

// lostInstances are the lost instances of held claims.
type lostInstances struct {
	// checking serialises a check of the instances with a prepare that
	// makes one again: a check that found an instance gone must not
	// report it after the prepare made it again.
	checking sync.Mutex

	mu sync.Mutex
	m  map[lostKey]Lost
	// changed tells the plugin that what a held claim's status and the
	// slices say of its devices changed.
	changed *Changes
}

func newLostInstances() lostInstances {
	return lostInstances{changed: &Changes{signal: make(chan struct{}, 1)}}
}

// add records k; false where it was recorded already.
func (l *lostInstances) add(k lostKey, li Lost) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[k]; ok {
		return false
	}
	if l.m == nil {
		l.m = map[lostKey]Lost{}
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

func (l *lostInstances) get(k lostKey) (Lost, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	li, ok := l.m[k]
	return li, ok
}

// ofClaim are the devices of a claim whose instance is lost, sorted.
func (l *lostInstances) ofClaim(uid types.UID) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k := range l.m {
		if k.claim == uid {
			out = append(out, k.device)
		}
	}
	slices.Sort(out)
	return out
}

// Changes are the held claims whose MIG devices changed (an instance
// went, or was made again): their status is written again, and the
// slices published again with the devices' taints.
type Changes struct {
	signal chan struct{}

	mu     sync.Mutex
	claims []types.UID
}

// note records that claims changed (none: only what is published).
func (c *Changes) note(claims ...types.UID) {
	c.mu.Lock()
	for _, uid := range claims {
		if !slices.Contains(c.claims, uid) {
			c.claims = append(c.claims, uid)
		}
	}
	c.mu.Unlock()
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

// C is signalled after a change.
func (c *Changes) C() <-chan struct{} { return c.signal }

// Take returns the claims changed since the last Take.
func (c *Changes) Take() []types.UID {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.claims
	c.claims = nil
	return out
}

// Changes are the held claims whose MIG devices changed.
func (s *Seats) Changes() *Changes { return s.lost.changed }

// Lost says whether the instance of a claim's device is gone.
func (s *Seats) Lost(uid types.UID, device string) (Lost, bool) {
	return s.lost.get(lostKey{uid, device})
}

// LostDevices maps each device with a lost instance to it.
func (s *Seats) LostDevices() map[string]Lost {
	s.lost.mu.Lock()
	defer s.lost.mu.Unlock()
	out := make(map[string]Lost, len(s.lost.m))
	for k, li := range s.lost.m {
		out[k.device] = li
	}
	return out
}

// InstanceUUID is the UUID of the MIG device made for a claim's device,
// which its status records; "" for a device that is not a MIG device, or
// whose instance is not made or lost.
func (s *Seats) InstanceUUID(uid types.UID, dev checkpoint.Device) string {
	if s.instances == nil {
		return ""
	}
	if _, ok := s.want(uid, dev); !ok {
		return ""
	}
	if _, lost := s.Lost(uid, dev.Device); lost {
		return ""
	}
	inst, ok, err := s.instances.Lookup(uid, dev.Device)
	if err != nil || !ok {
		return ""
	}
	return inst.UUID
}

// TaintLost taints the devices of res whose MIG instance is gone. A
// device tainted under the key already (its GPU or its instance is
// unhealthy) keeps that taint alone.
func TaintLost(res resourceslice.DriverResources, lost map[string]Lost) {
	if len(lost) == 0 {
		return
	}
	taints := make(map[string]resourceapi.DeviceTaint, len(lost))
	for device := range lost {
		taints[device] = resourceapi.DeviceTaint{Key: draresources.TaintKey, Value: instanceGone, Effect: resourceapi.DeviceTaintEffectNoSchedule}
	}
	draresources.TaintDevices(res, taints)
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
func (s *Seats) lostAtStart(ctx context.Context, held Held, specs Specs) {
	if s.instances == nil {
		return
	}
	claims := held.PreparedClaims()
	for _, uid := range slices.Sorted(maps.Keys(claims)) {
		c := claims[uid]
		if c.Fenced() || !specs.Exists(uid) {
			continue
		}
		for _, dev := range c.Devices {
			w, ok := s.want(uid, dev)
			if !ok {
				continue
			}
			if _, made, err := s.instances.Lookup(uid, dev.Device); err != nil || made {
				continue
			}
			s.reportLost(ctx, uid, c, dev.Device, describePlanned(w))
		}
	}
}

// checkLost checks the instances of the held claims against NVML and
// reports those gone. It forgets the lost instances of claims released
// since (a stale claim's release does not go through an unprepare), and
// those that the journal names again, whole: made again by a prepare.
func (s *Seats) checkLost(ctx context.Context, held Held, specs Specs) {
	s.lost.checking.Lock()
	defer s.lost.checking.Unlock()
	gone, err := s.instances.Gone(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot check every MIG instance of the held claims; checked again later")
	}
	claims := held.PreparedClaims()
	stillGone := map[lostKey]bool{}
	for _, r := range gone {
		stillGone[lostKey{r.Claim, r.Device}] = true
		if c, ok := claims[r.Claim]; ok && specs.Exists(r.Claim) {
			s.reportLost(ctx, r.Claim, c, r.Device, describeRecord(r))
		}
	}
	dropped := s.lost.drop(func(k lostKey) bool {
		if claims[k.claim] == nil {
			return true
		}
		if err != nil || stillGone[k] {
			return false
		}
		_, made, lerr := s.instances.Lookup(k.claim, k.device)
		return lerr == nil && made
	})
	if len(dropped) == 0 {
		return
	}
	var changed []types.UID
	for _, k := range dropped {
		if claims[k.claim] != nil {
			changed = append(changed, k.claim)
		}
	}
	s.lost.changed.note(changed...)
}

// Verify finds, at a repeated prepare of a held claim, which of its MIG
// devices' instances are gone: known already, not named by the journal
// while the claim's spec is on the node (specExists), or not whole on the
// GPU. It reports those not known yet; Prepare makes them again.
func (s *Seats) Verify(ctx context.Context, uid types.UID, c *checkpoint.Claim, specExists bool) (lost []string) {
	if s.instances == nil || !slices.ContainsFunc(c.Devices, func(dev checkpoint.Device) bool { _, ok := s.want(uid, dev); return ok }) {
		return nil
	}
	s.lost.checking.Lock()
	defer s.lost.checking.Unlock()
	var check bool
	for _, dev := range c.Devices {
		w, ok := s.want(uid, dev)
		if !ok {
			continue
		}
		if _, known := s.Lost(uid, dev.Device); known {
			lost = append(lost, dev.Device)
			continue
		}
		_, made, err := s.instances.Lookup(uid, dev.Device)
		switch {
		case err != nil:
			// The prepare that follows reports it.
		case made:
			check = true
		case specExists:
			s.reportLost(ctx, uid, c, dev.Device, describePlanned(w))
			lost = append(lost, dev.Device)
		}
	}
	if !check {
		return lost
	}
	gone, err := s.instances.Gone(ctx, uid)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot check the claim's MIG instances", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
	}
	for _, r := range gone {
		if !slices.Contains(lost, r.Device) {
			s.reportLost(ctx, uid, c, r.Device, describeRecord(r))
			lost = append(lost, r.Device)
		}
	}
	return lost
}

// reportLost records that the instance of a held claim's device is gone
// and, the first time, says so: log line, events on the Node and the
// claim, and a change of the claim's status, the device's taint and its
// health (Changes).
func (s *Seats) reportLost(ctx context.Context, uid types.UID, c *checkpoint.Claim, device, instance string) {
	li := Lost{namespace: c.Namespace, name: c.Name, device: device, instance: instance, Since: s.opts.Clock.Now()}
	if !s.lost.add(lostKey{uid, device}, li) {
		return
	}
	klog.FromContext(ctx).Error(nil, "The MIG instance of a held claim's device is gone; the device is tainted until the claim is released, and the claim's next prepare makes the instance again",
		"claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "device", device, "instance", instance)
	note := li.Note()
	s.opts.Events.Warning(ctx, nodeevents.ReasonMIGInstanceGone, note)
	s.opts.Events.Claim(ctx, claimRef(uid, c), corev1.EventTypeWarning, nodeevents.ReasonMIGInstanceGone, note)
	s.lost.changed.note(uid)
}

// madeAgain forgets the lost instances of a claim's devices that its
// prepare made again, and says so.
func (s *Seats) madeAgain(ctx context.Context, uid types.UID, c *checkpoint.Claim, devices []string) {
	dropped := s.lost.drop(func(k lostKey) bool { return k.claim == uid && slices.Contains(devices, k.device) })
	if len(dropped) == 0 {
		return
	}
	for _, k := range dropped {
		note := fmt.Sprintf("The MIG instance of claim %s/%s (device %s) that was gone is made again; the device's taint is removed", c.Namespace, c.Name, k.device)
		s.opts.Events.Normal(ctx, nodeevents.ReasonMIGInstanceMadeAgain, note)
		s.opts.Events.Claim(ctx, claimRef(uid, c), corev1.EventTypeNormal, nodeevents.ReasonMIGInstanceMadeAgain, note)
	}
	s.lost.changed.note(uid)
}

// claimRef is a claim for its events.
func claimRef(uid types.UID, c *checkpoint.Claim) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, UID: uid}}
}
