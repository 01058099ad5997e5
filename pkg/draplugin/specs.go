package draplugin

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containerclaims"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// claimSpecs are the CDI specs of prepared claims: one transient spec per
// claim, derived from its ledger entry alone, so that it can be written
// again after a reboot without the ResourceClaim.
type claimSpecs struct {
	writer *cdi.Writer
	inv    *inventory.Inventory
	edits  containeredits.Options
	// nvidiaCDI names NVIDIA's own CDI device for a GPU, when the plugin
	// takes the driver files from NVIDIA's spec.
	nvidiaCDI func(index int, uuid string) string
	// sharing gives the MPS clients' edits.
	sharing *sharing
	// mig gives the MIG instances of MIG devices.
	mig *migSeats
}

// Exists reports whether the claim's spec is on disk.
func (s *claimSpecs) Exists(uid types.UID) bool { return s.writer.Exists(uid) }

// Remove removes the claim's spec.
func (s *claimSpecs) Remove(uid types.UID) error { return s.writer.Remove(uid) }

// ReadEnv reads a claim's spec back.
func (s *claimSpecs) ReadEnv(uid types.UID) (map[string]map[string]string, bool, error) {
	return s.writer.ReadEnv(uid)
}

// Claims lists the claims that have a spec, and the files skipped.
func (s *claimSpecs) Claims() ([]types.UID, []string, error) { return s.writer.Claims() }

// Write writes the claim's spec. A claim with no device of this driver
// gets none.
func (s *claimSpecs) Write(uid types.UID, c *checkpoint.Claim) error {
	if len(c.Devices) == 0 {
		return nil
	}
	devices, err := s.devices(uid, c)
	if err != nil {
		return err
	}
	return s.writer.Write(uid, devices)
}

// devices derives a claim's CDI devices from its entry. Every device of a
// request carries the edits of the whole request: a container that takes
// the request sees all of its seats in one consistent environment,
// whichever device the runtime applies last.
func (s *claimSpecs) devices(uid types.UID, c *checkpoint.Claim) ([]cdi.Device, error) {
	byRequest := map[string][]containeredits.Seat{}
	devsOf := map[string][]checkpoint.Device{}
	visible := map[string]v1alpha1.VisibleDevices{}
	var order []string
	for _, dev := range c.Devices {
		seat := containeredits.Seat{Group: dev.Group, Seats: dev.Seats, Generations: dev.Generations, AdminAccess: dev.AdminAccess}
		if s.mig != nil {
			m, err := s.mig.device(uid, dev)
			if err != nil {
				return nil, err
			}
			seat.MIG = m
		}
		for i, x := range dev.GPUs {
			gpu, err := s.gpu(x, dev.GPUUUIDs[i])
			if err != nil {
				return nil, fmt.Errorf("device %s: %w", dev.Device, err)
			}
			seat.GPUs = append(seat.GPUs, gpu)
		}
		for _, r := range dev.Requests {
			if _, seen := byRequest[r]; !seen {
				order = append(order, r)
			}
			byRequest[r] = append(byRequest[r], seat)
			devsOf[r] = append(devsOf[r], dev)
			visible[r] = v1alpha1.VisibleDevices(dev.VisibleDevices)
		}
	}
	edits := map[string]*containeredits.Edits{}
	combined := containerclaims.Combined(c)
	for _, r := range order {
		opts := s.edits
		opts.VisibleDevices = visible[r]
		m, err := s.sharing.mpsEdits(devsOf[r])
		if err != nil {
			return nil, fmt.Errorf("request %s: %w", r, err)
		}
		opts.MPS = m
		// An MPS client's indices count its daemon's GPUs, and one past
		// them is an error there: it keeps its own GPUs' names. (A
		// container joins one daemon only; MPS seats beside other claims
		// in one container are not supported.)
		if combined && m == nil {
			opts.CombinedOf = c.IndexedGPUs(len(s.inv.GPUs))
		}
		e, err := containeredits.Build(byRequest[r], opts)
		if err != nil {
			return nil, fmt.Errorf("request %s: %w", r, err)
		}
		edits[r] = e
	}
	out := make([]cdi.Device, 0, len(c.Devices))
	for _, dev := range c.Devices {
		out = append(out, cdi.Device{Name: dev.CDIDevice, Edits: edits[dev.Requests[0]]})
	}
	return out, nil
}

// gpu returns the inventory's GPU at index x, checking that it is still the
// GPU the seat was given on (a GPU swapped between boots gets a new UUID).
func (s *claimSpecs) gpu(x int, uuid string) (inventory.GPU, error) {
	g, ok := s.inv.GPUByIndex(x)
	if !ok {
		return inventory.GPU{}, fmt.Errorf("GPU %d no longer exists on this node", x)
	}
	if g.UUID != uuid {
		return inventory.GPU{}, fmt.Errorf("GPU %d is now %s, not %s as when the seat was handed out", x, g.UUID, uuid)
	}
	return *g, nil
}

// ids are the CDI device IDs the kubelet passes to the runtime for one
// device of a claim: ours, plus NVIDIA's own entries for the group's GPUs
// where the node has NVIDIA's CDI spec and the plugin uses it for the
// driver's files.
func (s *claimSpecs) ids(uid types.UID, dev checkpoint.Device) []string {
	var nvidia []string
	if s.nvidiaCDI != nil {
		for i, x := range dev.GPUs {
			if id := s.nvidiaCDI(x, dev.GPUUUIDs[i]); id != "" {
				nvidia = append(nvidia, id)
			}
		}
	}
	return cdi.InjectionOrder(cdi.DeviceID(uid, dev.CDIDevice), nvidia)
}
