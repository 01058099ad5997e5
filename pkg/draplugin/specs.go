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
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatkind"
)

// claimSpecs are the CDI specs of prepared claims: one transient spec per
// claim, derived from its ledger entry alone, so that it can be written
// again after a reboot without the ResourceClaim.
type claimSpecs struct {
	writer     *cdi.Writer
	inv        *inventory.Inventory
	containers ContainerOptions
	// kinds add what their devices need to each request's edits.
	kinds []seatkind.Kind
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

// specPlan is one claim's spec as planned from its entry: each request's
// seats and edit options, as the seat kinds completed them. A prepare
// plans its claim once, and writes its spec and answers its device
// metadata from the one plan.
type specPlan struct {
	requests map[string]*seatkind.Request
	order    []string
}

// request is the plan of the request a device serves first.
func (p *specPlan) request(dev checkpoint.Device) *seatkind.Request {
	if p == nil || len(dev.Requests) == 0 {
		return nil
	}
	return p.requests[dev.Requests[0]]
}

// plan plans a claim's spec from its entry. Every device of a request
// carries the edits of the whole request (seatkind.Request).
func (s *claimSpecs) plan(uid types.UID, c *checkpoint.Claim) (*specPlan, error) {
	p := &specPlan{requests: map[string]*seatkind.Request{}}
	for _, dev := range c.Devices {
		seat := containeredits.Seat{Group: dev.Group, Seats: dev.Seats, Generations: dev.Generations, AdminAccess: dev.AdminAccess, Size: dev.Size}
		for i, x := range dev.GPUs {
			gpu, err := s.gpu(x, dev.GPUUUIDs[i])
			if err != nil {
				return nil, fmt.Errorf("device %s: %w", dev.Device, err)
			}
			seat.GPUs = append(seat.GPUs, gpu)
		}
		for _, name := range dev.Requests {
			r := p.requests[name]
			if r == nil {
				opts := s.containers.Edits
				r = &seatkind.Request{Name: name, Options: &opts}
				p.requests[name] = r
				p.order = append(p.order, name)
			}
			r.Devices = append(r.Devices, dev)
			r.Seats = append(r.Seats, seat)
			r.Options.VisibleDevices = v1alpha1.VisibleDevices(dev.VisibleDevices)
		}
	}
	combined := containerclaims.Combined(c)
	for _, name := range p.order {
		r := p.requests[name]
		for _, k := range s.kinds {
			if err := k.Edit(uid, *r); err != nil {
				return nil, fmt.Errorf("request %s: %w", name, err)
			}
		}
		// An MPS client's indices count its daemon's GPUs, and one past
		// them is an error there: it keeps its own GPUs' names. (A
		// container joins one daemon only; MPS seats beside other claims
		// in one container are not supported.)
		if combined && r.Options.MPS == nil {
			r.Options.CombinedOf = c.IndexedGPUs(len(s.inv.GPUs))
		}
	}
	return p, nil
}

// Write plans the claim's spec and writes it (the seat ledger's Specs).
func (s *claimSpecs) Write(uid types.UID, c *checkpoint.Claim) error {
	p, err := s.plan(uid, c)
	if err != nil {
		return err
	}
	return s.write(uid, c, p)
}

// write writes a claim's spec as planned. A claim with no device of this
// driver gets none.
func (s *claimSpecs) write(uid types.UID, c *checkpoint.Claim, p *specPlan) error {
	if len(c.Devices) == 0 {
		return nil
	}
	edits := map[string]*containeredits.Edits{}
	for _, name := range p.order {
		r := p.requests[name]
		e, err := containeredits.Build(r.Seats, *r.Options)
		if err != nil {
			return fmt.Errorf("request %s: %w", name, err)
		}
		edits[name] = e
	}
	devices := make([]cdi.Device, 0, len(c.Devices))
	for _, dev := range c.Devices {
		devices = append(devices, cdi.Device{Name: dev.CDIDevice, Edits: edits[dev.Requests[0]]})
	}
	return s.writer.Write(uid, devices)
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
	if s.containers.NVIDIACDIDevice != nil {
		for i, x := range dev.GPUs {
			if id := s.containers.NVIDIACDIDevice(x, dev.GPUUUIDs[i]); id != "" {
				nvidia = append(nvidia, id)
			}
		}
	}
	return cdi.InjectionOrder(cdi.DeviceID(uid, dev.CDIDevice), nvidia)
}
