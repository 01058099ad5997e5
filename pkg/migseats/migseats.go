// Package migseats is the kind of seat that is a MIG instance of its own
// (seatkind.Kind). A claim's seat on a MIG device is recorded in the seat
// ledger as any seat, and its instance is made at prepare, after the seat
// is recorded and before the spec is written (the spec names the
// instance's UUID and capability nodes); the instance is destroyed at
// unprepare before the seat is released, so that a seat whose instance
// could not be destroyed stays held and the kubelet's retry destroys it.
// Package miginstance makes the instances and keeps their journal.
//
// The MIG seats also own what MIG means for the rest of the node: the
// MIG mode of the whole-GPU groups that MIG seats share (off before such
// a group is prepared), the partitions found at start that the plugin did
// not make (static.go), the GPUs whose MIG devices cannot be published
// (mode.go), and the instances of held claims that went without the
// plugin (lost.go).
package migseats

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatkind"
)

// Options configure the MIG seats. NVML, Minors, Step and CheckInterval
// are the operator's (the plugin's options); the plugin fills in the rest.
type Options struct {
	// NVML makes the instances; nil where the plan has no MIG profile.
	NVML miginstance.Library
	// Minors reads /proc/driver/nvidia-caps/mig-minors.
	Minors func() ([]byte, error)
	// Step, for tests only, stops an instance's making or destruction at
	// a step as a crash would (miginstance.Options.Step).
	Step func(step string) bool
	// CheckInterval is how often the instances of held claims are checked
	// against NVML, to report those gone (lost.go); default 30s.
	CheckInterval time.Duration

	// Node is what the node serves.
	Node draresources.Node
	// Dir holds the journal, beside the seat checkpoint.
	Dir string
	// BootID is the node's boot, which the journal's records carry.
	BootID string
	// Events reports a damaged journal, partitions, lost instances.
	Events *nodeevents.Recorder
	// Registry takes the partitions' gauge.
	Registry prometheus.Registerer
	Clock    clock.WithTicker
}

// Held is what the MIG seats read of the seat ledger (seatledger.Ledger).
type Held interface {
	// Lost reports whether the checkpoint is lost and not rebuilt yet.
	Lost() bool
	// Refresh reads the checkpoint again where the other pod of a rolling
	// update may have changed it: its claims' instances are not stale.
	Refresh(ctx context.Context) error
	PreparedUIDs() []types.UID
	PreparedClaims() map[types.UID]*checkpoint.Claim
}

// Specs tells whether a claim's spec is on the node (the plugin's claim
// specs): a claim without one has no container on its instance.
type Specs interface {
	Exists(uid types.UID) bool
}

// Seats are the MIG instances of the node's claims.
type Seats struct {
	opts Options
	// instances is nil where no NVML was given: a MIG claim then fails
	// its prepare, saying so.
	instances *miginstance.Manager
	// found is what the survey at start found (static.go, mode.go), read
	// by the publisher from then on.
	found survey
	// lost are the held claims' devices whose instance is gone (lost.go).
	lost lostInstances
}

var _ seatkind.Kind = (*Seats)(nil)

// Open reads the journal and settles what a crash left half made, before
// the seat ledger writes the specs a start owes: half-made instances go,
// and records of instances a reboot took are forgotten, so that no spec
// names an instance that is not there. It reports, once, the GPUs given
// to MIG profiles that NVML gives no MIG geometry for.
func Open(ctx context.Context, opts Options) (*Seats, error) {
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = defaultCheckInterval
	}
	s := &Seats{opts: opts, found: survey{partitions: newPartitionsGauge()}, lost: newLostInstances()}
	if err := opts.Registry.Register(s.found.partitions); err != nil {
		return nil, fmt.Errorf("register the MIG partition metrics: %w", err)
	}
	if opts.NVML != nil && opts.Node.Plan.HasMIG() {
		m, err := miginstance.New(miginstance.Options{Dir: opts.Dir, NVML: opts.NVML, Minors: opts.Minors, Step: opts.Step,
			BootID: opts.BootID, Held: s.heldInCheckpoint(opts.Dir), Warn: opts.Events.Warning})
		if err != nil {
			return nil, err
		}
		s.instances = m
	}
	s.reconcile(ctx, nil)
	reportNoMIGGeometry(ctx, opts)
	return s, nil
}

// Start settles the instances against the opened ledger and surveys the
// node, before the kubelet can call: instances made for claims the
// checkpoint no longer holds (an unprepare lost in a crash) go, those
// nobody recorded are what the node publishes around from its first
// publish on, and a prepared claim whose instance this start's settling
// (or an earlier one) found gone is reported.
func (s *Seats) Start(ctx context.Context, held Held, specs Specs) {
	s.reconcile(ctx, held)
	s.found.run(ctx, s.instances, s.opts)
	s.lostAtStart(ctx, held, specs)
}

// Run checks the held claims' instances every CheckInterval until ctx
// ends, and reports those gone.
func (s *Seats) Run(ctx context.Context, held Held, specs Specs) {
	if s.instances == nil {
		return
	}
	t := s.opts.Clock.NewTicker(s.opts.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			s.checkLost(ctx, held, specs)
		}
	}
}

// Settle follows a release of claims outside the kubelet's calls (stale
// claims): their instances go, and so does what was reported of them.
func (s *Seats) Settle(ctx context.Context, held Held, specs Specs) {
	s.reconcile(ctx, held)
	if s.instances != nil {
		s.checkLost(ctx, held, specs)
	}
}

// want is the instance a claim's device stands for; false for a device
// that is not a MIG device.
func (s *Seats) want(uid types.UID, dev checkpoint.Device) (miginstance.Want, bool) {
	node := s.opts.Node
	ref, ok := node.Index[dev.Device]
	if !ok || ref.MIG == nil || dev.AdminAccess || dev.Fenced {
		return miginstance.Want{}, false
	}
	gpu := ref.MIG.GPU.Index()
	g := node.Inv.GPUs[gpu]
	return miginstance.Want{
		Claim: uid, Device: dev.Device, GPU: gpu, GPUMinor: g.Minor, GPUUUID: g.UUID, Architecture: g.Architecture,
		Profile: ref.MIG.GPU.Profile, Placement: ref.MIG.Placement, Adopt: s.found.static[dev.Device],
	}, true
}

// Prepare makes the instances of a claim's MIG devices, or finds those
// made, and turns MIG mode off on the GPUs of its whole-GPU groups that
// MIG seats share (miginstance.Manager.WholeGPU). An instance that was
// gone (Verify) is made again at its placement, and what was reported of
// it goes.
func (s *Seats) Prepare(ctx context.Context, uid types.UID, c *checkpoint.Claim) error {
	lost := s.lost.ofClaim(uid)
	if len(lost) > 0 {
		// No check of the instances reports one gone while it is made
		// again.
		s.lost.checking.Lock()
		defer s.lost.checking.Unlock()
	}
	for _, dev := range c.Devices {
		if err := s.prepareDevice(ctx, uid, dev); err != nil {
			if len(lost) > 0 {
				err = fmt.Errorf("the MIG instance of %s is gone and cannot be made again (the device stays tainted until the claim is released): %w", strings.Join(lost, ", "), err)
			}
			return seatkind.Failed(seatkind.ErrMIG, err)
		}
	}
	s.madeAgain(ctx, uid, c, lost)
	return nil
}

func (s *Seats) prepareDevice(ctx context.Context, uid types.UID, dev checkpoint.Device) error {
	w, ok := s.want(uid, dev)
	if !ok {
		if err := s.wholeGPUs(ctx, dev); err != nil {
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
		return nil
	}
	if s.instances == nil {
		return fmt.Errorf("device %s is a MIG instance, and this plugin was started without NVML to make it", dev.Device)
	}
	if _, err := s.instances.Ensure(ctx, w); err != nil {
		return fmt.Errorf("device %s: make MIG %s instance at %s on GPU %d: %w", dev.Device, w.Profile.Name, w.Placement, w.GPU, err)
	}
	return nil
}

// wholeGPUs readies the GPUs of a whole-GPU group that MIG seats share
// for the group: MIG mode off. An admin-access device changes nothing:
// it is given beside the GPUs' other holders.
func (s *Seats) wholeGPUs(ctx context.Context, dev checkpoint.Device) error {
	node := s.opts.Node
	ref, ok := node.Index[dev.Device]
	if s.instances == nil || !ok || ref.MIG != nil || dev.AdminAccess || dev.Fenced {
		return nil
	}
	models := node.Plan.MIGModels()
	for _, gpu := range ref.Group.GPUs {
		if _, ok := models[gpu]; !ok {
			continue
		}
		if err := s.instances.WholeGPU(ctx, gpu, node.Inv.GPUs[gpu].Architecture); err != nil {
			return err
		}
	}
	return nil
}

// Edit gives each MIG device of the request its instance: the UUID a
// container's CUDA_VISIBLE_DEVICES names and the capability nodes that
// let it in.
func (s *Seats) Edit(uid types.UID, req seatkind.Request) error {
	for i, dev := range req.Devices {
		m, err := s.device(uid, dev)
		if err != nil {
			return err
		}
		if m != nil {
			req.Seats[i].MIG = m
		}
	}
	return nil
}

// device is what a container needs of a claim's MIG device; nil for a
// device that is not one.
func (s *Seats) device(uid types.UID, dev checkpoint.Device) (*containeredits.MIGDevice, error) {
	if _, ok := s.want(uid, dev); !ok {
		return nil, nil
	}
	if s.instances == nil {
		return nil, fmt.Errorf("device %s is a MIG instance, and this plugin was started without NVML to make it", dev.Device)
	}
	inst, ok, err := s.instances.Lookup(uid, dev.Device)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("device %s: its MIG instance is not made (yet)", dev.Device)
	}
	return &containeredits.MIGDevice{UUID: inst.UUID, CapabilityNodes: inst.CapabilityNodes}, nil
}

// Release destroys the instances made for the claims; err per claim.
func (s *Seats) Release(ctx context.Context, uids []types.UID) map[types.UID]error {
	out := map[types.UID]error{}
	if s.instances == nil {
		return out
	}
	for _, uid := range uids {
		if err := s.instances.Destroy(ctx, uid); err != nil {
			out[uid] = seatkind.Failed(seatkind.ErrMIG, err)
		}
	}
	return out
}

// Released forgets the lost instances of released claims.
func (s *Seats) Released(_ context.Context, uids []types.UID) {
	if s.instances == nil || len(uids) == 0 {
		return
	}
	if dropped := s.lost.drop(func(k lostKey) bool { return slices.Contains(uids, k.claim) }); len(dropped) > 0 {
		s.lost.changed.note()
	}
}

// reconcile settles what a crash or a lost unprepare left (see
// miginstance.Manager.Reconcile). With no ledger yet (before it is
// opened), or a lost checkpoint, no made instance is destroyed. The
// instances no record names are left (survey).
func (s *Seats) reconcile(ctx context.Context, held Held) {
	if s.instances == nil {
		return
	}
	// Called under the journal's lock: a prepare records its seat before
	// it takes that lock to make the instance, so no instance being made
	// is taken for a stale one.
	prepared := func() (map[types.UID]bool, bool) {
		if held == nil || held.Lost() {
			return nil, false
		}
		if err := held.Refresh(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot read the checkpoint the other plugin pod may have written; no MIG instance is destroyed now")
			return nil, false
		}
		out := map[types.UID]bool{}
		for _, uid := range held.PreparedUIDs() {
			out[uid] = true
		}
		return out, true
	}
	if err := s.instances.Reconcile(ctx, prepared); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot settle every MIG instance; retried at the next start and after stale claims are released")
	}
}
