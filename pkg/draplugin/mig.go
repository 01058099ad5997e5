package draplugin

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

// MIG seats: a claim's seat on a MIG device is recorded in the ledger as
// any seat, and its instance is made at prepare, after the seat is
// recorded and before the spec is written (the spec names the instance's
// UUID and capability nodes); the instance is destroyed at unprepare
// before the seat is released, so that a seat whose instance could not
// be destroyed stays held and the kubelet's retry destroys it. Package
// miginstance makes the instances and keeps their journal.

// MIG configures the making of MIG instances.
type MIG struct {
	// NVML makes the instances; nil where the plan has no MIG profile.
	NVML miginstance.Library
	// Minors reads /proc/driver/nvidia-caps/mig-minors.
	Minors func() ([]byte, error)
	// Step, for tests only, stops an instance's making or destruction at
	// a step as a crash would (miginstance.Options.Step).
	Step func(step string) bool
	// CheckInterval is how often the instances of held claims are checked
	// against NVML, to report those gone (mig_lost.go); default 30s.
	CheckInterval time.Duration
}

// migSeats are the MIG instances of the node's claims.
type migSeats struct {
	node draresources.Node
	// instances is nil where no NVML was given: a MIG claim then fails
	// its prepare, saying so.
	instances *miginstance.Manager
	// refresh, where the other pod of a rolling update shares the node,
	// reads the checkpoint it may have written: its claims' instances are
	// not stale.
	refresh func(context.Context) error
	// static are the MIG devices whose instances the plugin did not make
	// and adopts (mig_static.go), set at start before the kubelet calls.
	static map[string]bool
	// unlisted are the MIG GPUs whose instances could not be listed at
	// start: their MIG devices are not published.
	unlisted []int
	// partitions counts the instances the plugin did not make, by GPU and
	// kind (static, foreign).
	partitions *prometheus.GaugeVec
	// lost are the held claims' devices whose instance is gone
	// (mig_lost.go).
	lost lostInstances
}

func newMIGSeats(opts MIG, node draresources.Node, dir string, journal migJournal) (*migSeats, error) {
	s := &migSeats{node: node, partitions: newPartitionsGauge()}
	if opts.NVML == nil || !node.Plan.HasMIG() {
		return s, nil
	}
	m, err := miginstance.New(miginstance.Options{Dir: dir, NVML: opts.NVML, Minors: opts.Minors, Step: opts.Step,
		BootID: journal.bootID, Held: s.heldInCheckpoint(dir), Warn: journal.events.Warning})
	if err != nil {
		return nil, err
	}
	s.instances = m
	return s, nil
}

// want is the instance a claim's device stands for; false for a device
// that is not a MIG device.
func (s *migSeats) want(uid types.UID, dev checkpoint.Device) (miginstance.Want, bool) {
	ref, ok := s.node.Index[dev.Device]
	if !ok || ref.MIG == nil || dev.AdminAccess || dev.Fenced {
		return miginstance.Want{}, false
	}
	gpu := ref.MIG.GPU.Index()
	g := s.node.Inv.GPUs[gpu]
	return miginstance.Want{
		Claim: uid, Device: dev.Device, GPU: gpu, GPUMinor: g.Minor, GPUUUID: g.UUID, Architecture: g.Architecture,
		Profile: ref.MIG.GPU.Profile, Placement: ref.MIG.Placement, Adopt: s.static[dev.Device],
	}, true
}

// prepare makes the instances of a claim's MIG devices, or finds those
// made, and turns MIG mode off on the GPUs of its whole-GPU groups that
// MIG seats share (miginstance.Manager.WholeGPU).
func (s *migSeats) prepare(ctx context.Context, uid types.UID, c *checkpoint.Claim) error {
	for _, dev := range c.Devices {
		w, ok := s.want(uid, dev)
		if !ok {
			if err := s.wholeGPUs(ctx, dev); err != nil {
				return fmt.Errorf("device %s: %w", dev.Device, err)
			}
			continue
		}
		if s.instances == nil {
			return fmt.Errorf("device %s is a MIG instance, and this plugin was started without NVML to make it", dev.Device)
		}
		if _, err := s.instances.Ensure(ctx, w); err != nil {
			return fmt.Errorf("device %s: make MIG %s instance at %s on GPU %d: %w", dev.Device, w.Profile.Name, w.Placement, w.GPU, err)
		}
	}
	return nil
}

// wholeGPUs readies the GPUs of a whole-GPU group that MIG seats share
// for the group: MIG mode off. An admin-access device changes nothing:
// it is given beside the GPUs' other holders.
func (s *migSeats) wholeGPUs(ctx context.Context, dev checkpoint.Device) error {
	ref, ok := s.node.Index[dev.Device]
	if s.instances == nil || !ok || ref.MIG != nil || dev.AdminAccess || dev.Fenced {
		return nil
	}
	models := s.node.Plan.MIGModels()
	for _, gpu := range ref.Group.GPUs {
		if _, ok := models[gpu]; !ok {
			continue
		}
		if err := s.instances.WholeGPU(ctx, gpu, s.node.Inv.GPUs[gpu].Architecture); err != nil {
			return err
		}
	}
	return nil
}

// release destroys the instances made for the claims; err per claim.
func (s *migSeats) release(ctx context.Context, uids []types.UID) map[types.UID]error {
	out := map[types.UID]error{}
	if s.instances == nil {
		return out
	}
	for _, uid := range uids {
		if err := s.instances.Destroy(ctx, uid); err != nil {
			out[uid] = err
		}
	}
	return out
}

// device is what a container needs of a claim's MIG device; nil for a
// device that is not one.
func (s *migSeats) device(uid types.UID, dev checkpoint.Device) (*containeredits.MIGDevice, error) {
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

// reconcile settles what a crash or a lost unprepare left (see
// miginstance.Manager.Reconcile). With no ledger yet (before it is
// opened), or a lost checkpoint, no made instance is destroyed. The
// instances no record names are left (survey).
func (s *migSeats) reconcile(ctx context.Context, ledger *seatledger.Ledger) {
	if s.instances == nil {
		return
	}
	// Called under the journal's lock: a prepare records its seat before
	// it takes that lock to make the instance, so no instance being made
	// is taken for a stale one.
	prepared := func() (map[types.UID]bool, bool) {
		if ledger == nil || ledger.Lost() {
			return nil, false
		}
		if s.refresh != nil {
			if err := s.refresh(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Cannot read the checkpoint the other plugin pod may have written; no MIG instance is destroyed now")
				return nil, false
			}
		}
		held := map[types.UID]bool{}
		for _, uid := range ledger.PreparedUIDs() {
			held[uid] = true
		}
		return held, true
	}
	if err := s.instances.Reconcile(ctx, prepared); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot settle every MIG instance; retried at the next start and after stale claims are released")
	}
}
