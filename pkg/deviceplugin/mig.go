package deviceplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// MIG seats in the shim, as the NVIDIA device plugin's mixed strategy
// serves them: one extended resource per MIG profile (kyb.ai/mig-1g.10gb),
// one device per seat. The kubelet counts each resource on its own and
// cannot keep overlapping placements apart, so each seat is an instance at
// a fixed placement, chosen at start so that the seats of every MIG
// profile on a GPU are disjoint (larger profiles first: slice 0 is the
// only placement of 4g and 7g), and the GPUs a MIG profile has serve no
// whole-GPU group of the shim.
//
// The kubelet never says when a seat is released, so a seat's instance
// is found or made at its first Allocate (through pkg/miginstance and its
// journal, as a DRA prepare makes it) and kept: the seat's next holder
// gets the same instance. An instance an administrator made at the seat's
// placement (of its profile, one compute instance spanning it) is adopted,
// as the NVIDIA device plugin serves partitions made beforehand, and never
// destroyed. The journal's claim is the seat (device-plugin/<seat ID>), so
// a DRA plugin that later serves the node finds no prepared claim for it:
// it destroys the instances the shim made and forgets those it adopted.
// What a crash left half made is rolled back at start; made instances of
// the configuration's seats are kept, in use or not, since the shim
// cannot tell, and those of seats the configuration no longer has are
// destroyed at start once no container holds them (mig_survey.go), which
// also keeps the seats that cannot be made from being handed out.

// MIG makes MIG instances for the MIG profiles' seats.
type MIG struct {
	// NVML makes the instances; required where the plan has a MIG profile.
	NVML miginstance.Library
	// Minors reads /proc/driver/nvidia-caps/mig-minors.
	Minors func() ([]byte, error)
	// Dir holds the journal of the instances made (mig-instances.json).
	Dir string
	// BootID is the node's boot, which the journal's records carry.
	BootID string
}

// migClaim is the journal's claim of a seat's instance.
func migClaim(seatID string) types.UID { return types.UID(driver.ShimMIGClaimPrefix + seatID) }

// migLayout chooses each MIG profile's seats, by resource: per GPU, at most the
// profile's seats, at placements disjoint from every other seat on the
// GPU, in the plan's order. warnings name the seats that did not fit.
func migLayout(plan *planner.Plan) (map[string][]planner.MIGDevice, []string) {
	all := plan.MIGDevices()
	order := slices.Clone(all)
	slices.SortStableFunc(order, func(a, b planner.MIGDevice) int {
		return cmp.Compare(b.GPU.Profile.MemorySlices, a.GPU.Profile.MemorySlices)
	})
	taken := map[int][]mig.Placement{}
	count := map[*planner.MIGGPU]int{}
	chosen := map[string]bool{}
	for _, d := range order {
		gpu := d.GPU.Index()
		if count[d.GPU] >= d.GPU.Seats || slices.ContainsFunc(taken[gpu], func(p mig.Placement) bool { return mig.Overlaps(p, d.Placement) }) {
			continue
		}
		taken[gpu] = append(taken[gpu], d.Placement)
		count[d.GPU]++
		chosen[d.DeviceName()] = true
	}
	out := map[string][]planner.MIGDevice{}
	var warnings []string
	seen := map[*planner.MIGGPU]bool{}
	for _, d := range all {
		if chosen[d.DeviceName()] {
			out[d.Profile().Resource] = append(out[d.Profile().Resource], d)
		}
		if !seen[d.GPU] {
			seen[d.GPU] = true
			if n := count[d.GPU]; n < d.GPU.Seats {
				warnings = append(warnings, fmt.Sprintf("%s: GPU %d serves %d of its %d seats of %s: the other MIG profiles' seats on the GPU take the placements of the rest", d.Profile().Resource, d.GPU.Index(), n, d.GPU.Seats, d.GPU.Profile.Name))
			}
		}
	}
	return out, warnings
}

// migGPUs are the GPUs the plan gives to MIG profiles.
func migGPUs(plan *planner.Plan) map[int]bool {
	out := map[int]bool{}
	for i := range plan.MIGModels() {
		out[i] = true
	}
	return out
}

// newMIGResource serves a MIG profile's seats: each seat a group of one
// seat (the GPU's group, once per seat), so that the preferred allocation
// and the health of whole-GPU seats apply unchanged.
// blocked says why each seat that cannot be made cannot (surveyMIG).
func newMIGResource(layout *planner.Plan, prof *planner.Profile, seats []planner.MIGDevice, blocked map[string]string, opts *Options, cdiWriter *cdi.Writer, instances *miginstance.Manager, stopped <-chan struct{}, logger klog.Logger) *resource {
	one := *prof
	one.SeatsPerGroup = 1
	r := newResource(layout, &one, opts, cdiWriter, nil, stopped, logger)
	r.groups, r.ids, r.seats = nil, nil, map[string]seatRef{}
	r.mig = &migSeats{instances: instances, seats: seats, blocked: make([]string, len(seats))}
	for i, d := range seats {
		id := d.DeviceName()
		r.groups = append(r.groups, d.GPU.Group)
		r.seats[id] = seatRef{group: i, seat: d.Placement.Start, idx: i}
		r.ids = append(r.ids, id)
		r.mig.blocked[i] = blocked[id]
	}
	r.gens = make([]atomic.Int64, len(r.ids))
	return r
}

// migSeats are a MIG resource's seats and the instances made for them.
type migSeats struct {
	instances *miginstance.Manager
	// seats by index, as resource.ids.
	seats []planner.MIGDevice
	// blocked, by index, says why a seat cannot be made ("" where it
	// can): it is served Unhealthy.
	blocked []string
}

// allocateMIG hands out a container's MIG seats: each seat's instance,
// made if it is not yet, and the edits a DRA prepare gives a claim of the
// same devices.
func (r *resource) allocateMIG(ctx context.Context, refs []seatRef) (*containeredits.Edits, []int64, error) {
	if r.mig.instances == nil {
		return nil, nil, errors.New("the shim was started without NVML to make MIG instances")
	}
	var seats []containeredits.Seat
	var gens []int64
	for _, ref := range refs {
		d := r.mig.seats[ref.idx]
		if why := r.mig.blocked[ref.idx]; why != "" {
			return nil, nil, fmt.Errorf("seat %s cannot be made: %s", r.ids[ref.idx], why)
		}
		gpu, ok := r.delivery.inv.GPUByIndex(d.GPU.Index())
		if !ok {
			return nil, nil, fmt.Errorf("GPU %d of seat %s is not in the inventory", d.GPU.Index(), r.ids[ref.idx])
		}
		inst, err := r.mig.instances.Ensure(ctx, miginstance.Want{
			Claim: migClaim(r.ids[ref.idx]), Device: r.ids[ref.idx], GPU: gpu.Index, GPUMinor: gpu.Minor, GPUUUID: gpu.UUID,
			Architecture: gpu.Architecture, Profile: d.GPU.Profile, Placement: d.Placement, Adopt: true,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("seat %s: make MIG %s instance at %s on GPU %d: %w", r.ids[ref.idx], d.GPU.Profile.Name, d.Placement, gpu.Index, err)
		}
		seats = append(seats, containeredits.Seat{Group: d.GPU.Group.Name, Seats: []int{ref.seat}, GPUs: []inventory.GPU{*gpu},
			MIG: &containeredits.MIGDevice{UUID: inst.UUID, CapabilityNodes: inst.CapabilityNodes}})
	}
	// Generations move once every instance is there: a failed request
	// hands out nothing.
	for i, ref := range refs {
		gen := r.gens[ref.idx].Add(1)
		seats[i].Generations = []int64{gen}
		gens = append(gens, gen)
	}
	edits, err := containeredits.Build(seats, r.delivery.edits)
	if err != nil {
		return nil, nil, err
	}
	return edits, gens, nil
}

// startMIG opens the journal of the MIG profiles' instances; surveyMIG
// settles it.
func startMIG(opts Options) (*miginstance.Manager, error) {
	if !opts.Plan.HasMIG() {
		return nil, nil
	}
	if opts.MIG.NVML == nil {
		return nil, errors.New("the configuration has MIG profiles, and the shim was given no NVML to make their instances")
	}
	if opts.MIG.Dir == "" {
		return nil, errors.New("the configuration has MIG profiles, and the shim was given no directory for the journal of their instances")
	}
	if err := os.MkdirAll(opts.MIG.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("create the MIG journal's directory: %w", err)
	}
	// The shim keeps no seat checkpoint: a journal damaged in both copies
	// is rebuilt empty, every instance left as one it did not make.
	return miginstance.New(miginstance.Options{Dir: opts.MIG.Dir, NVML: opts.MIG.NVML, Minors: opts.MIG.Minors, BootID: opts.MIG.BootID})
}
