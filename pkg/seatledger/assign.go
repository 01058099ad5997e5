package seatledger

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// assigner decides the seats of claims allocated on this node's pool,
// from the plan and inventory the node publishes.
type assigner struct {
	pool      string
	plan      *planner.Plan
	inventory *inventory.Inventory
	index     map[string]draresources.DeviceRef
}

// seats decides the seats of a claim's allocation results on this
// node and records them in st as prepared. It is pure bookkeeping: no
// files, no API calls. A claim an older plugin recorded as started keeps
// its seats and generations.
//
// It refuses, for this claim only: a device of another pool, a device the
// node does not publish, a seat or GPU another claim already holds, and an
// opaque configuration it does not understand.
func (a assigner) seats(st *checkpoint.State, claim *resourceapi.ResourceClaim) (*checkpoint.Claim, error) {
	// Before any bookkeeping: a claim whose spec cannot be written must
	// not hold seats it will never release.
	if err := cdi.CheckClaimUID(claim.UID); err != nil {
		return nil, err
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("the claim is not allocated")
	}
	if prev, ok := st.Claims[claim.UID]; ok && prev.Phase == checkpoint.PrepareStarted {
		prev.Phase = checkpoint.PrepareCompleted
		return prev, nil
	}
	alloc := claim.Status.Allocation
	// Whether the claim is standalone is decided with the call's other
	// claims (containerclaims.Combine).
	entry := &checkpoint.Claim{Namespace: claim.Namespace, Name: claim.Name, Phase: checkpoint.PrepareCompleted}
	// Record the entry while deciding, so that a claim with several
	// shares of one group gets distinct seats.
	st.Claims[claim.UID] = entry
	ok := false
	defer func() {
		if !ok {
			delete(st.Claims, claim.UID)
		}
	}()
	for _, result := range alloc.Devices.Results {
		if result.Driver != driver.Name {
			continue
		}
		dev, err := a.result(st, claim.UID, alloc.Devices.Config, result)
		if err != nil {
			return nil, err
		}
		entry.Devices = append(entry.Devices, dev)
	}
	ok = true
	return entry, nil
}

// result decides the seats of one allocation result.
func (a assigner) result(st *checkpoint.State, uid types.UID, configs []resourceapi.DeviceAllocationConfiguration, result resourceapi.DeviceRequestAllocationResult) (checkpoint.Device, error) {
	if result.Pool != a.pool {
		return checkpoint.Device{}, fmt.Errorf("device %s is in pool %q, but this node's pool is %q: the claim was allocated for another node", result.Device, result.Pool, a.pool)
	}
	ref, known := a.index[result.Device]
	if !known {
		return checkpoint.Device{}, fmt.Errorf("device %s is not published by this node; its configuration may have changed since the claim was allocated", result.Device)
	}
	cfg, err := seatConfig(configs, result)
	if err != nil {
		return checkpoint.Device{}, err
	}
	group := ref.Group
	groupDevice := group.DeviceName()
	if isAdmin(result) {
		// Monitoring: the group's GPUs, no seat; nothing held keeps it
		// off, and it keeps nothing off.
		return adminDevice(result, group, cfg, a.gpuUUIDs(group.GPUs)), nil
	}
	if err := checkExclusive(a.plan, st, uid, group); err != nil {
		return checkpoint.Device{}, err
	}
	// A fenced group's seats are all held, per-seat devices' included:
	// the claim fencing it may use any of them.
	if holder, fenced := st.FencedBy(groupDevice); fenced && holder != uid {
		return checkpoint.Device{}, fmt.Errorf("group %s is fenced: the seats claim %s holds on it could not be recovered, so none is handed out until that claim is released", group.Name, describeClaim(st, holder))
	}
	if err := checkSizing(st, uid, group); err != nil {
		return checkpoint.Device{}, err
	}
	var size *v1alpha1.SeatSize
	var seats []int
	if ref.Seat >= 0 {
		if holder, held := st.Holders(groupDevice)[ref.Seat]; held && holder != uid {
			return checkpoint.Device{}, fmt.Errorf("seat %d of group %s is already held by claim %s", ref.Seat, group.Name, describeClaim(st, holder))
		}
		seats = []int{ref.Seat}
	} else {
		if size, err = sizeOf(st, result, group); err != nil {
			return checkpoint.Device{}, err
		}
		n, err := seatsConsumed(result, group)
		if err != nil {
			return checkpoint.Device{}, err
		}
		if seats, err = st.FreeSeats(groupDevice, group.Seats(), n); err != nil {
			return checkpoint.Device{}, fmt.Errorf("group %s: %w; the scheduler counts seats, so another claim holds more than it should", group.Name, err)
		}
	}
	status := v1alpha1.SeatStatus{Profile: group.Profile.Name, Group: group.Name, GPUs: slices.Clone(group.GPUs), GPUUUIDs: a.gpuUUIDs(group.GPUs), Seats: seats, Size: size}
	for _, s := range seats {
		status.Generations = append(status.Generations, st.NextGeneration(groupDevice, s))
	}
	return newDevice(result, group, cfg, status), nil
}

// gpuUUIDs are the UUIDs of GPUs (indices).
func (a assigner) gpuUUIDs(gpus []int) []string {
	out := make([]string, len(gpus))
	for i, x := range gpus {
		out[i] = a.inventory.GPUs[x].UUID
	}
	return out
}

// isAdmin reports whether a result was allocated with admin access.
func isAdmin(result resourceapi.DeviceRequestAllocationResult) bool {
	return result.AdminAccess != nil && *result.AdminAccess
}

// adminDevice is the entry of a result allocated with admin access: the
// group and its GPUs, no seat.
func adminDevice(result resourceapi.DeviceRequestAllocationResult, group *planner.Group, cfg *v1alpha1.SeatConfig, uuids []string) checkpoint.Device {
	return newDevice(result, group, cfg, v1alpha1.SeatStatus{
		Profile: group.Profile.Name, Group: group.Name, GPUs: slices.Clone(group.GPUs), GPUUUIDs: uuids, AdminAccess: true,
	})
}

// newDevice is the entry of one allocation result on group holding the
// seats of status. Its CDI device name carries the share, so that a name
// is never reused for another share of the same device.
func newDevice(result resourceapi.DeviceRequestAllocationResult, group *planner.Group, cfg *v1alpha1.SeatConfig, status v1alpha1.SeatStatus) checkpoint.Device {
	dev := checkpoint.Device{
		Requests:       []string{resourceclaim.BaseRequestRef(result.Request)},
		Pool:           result.Pool,
		Device:         result.Device,
		GroupDevice:    group.DeviceName(),
		SeatStatus:     status,
		CDIDevice:      result.Device,
		VisibleDevices: string(cfg.VisibleDevices),
	}
	if result.ShareID != nil {
		dev.ShareID = string(*result.ShareID)
		dev.CDIDevice += "-" + dev.ShareID
	}
	return dev
}

// checkExclusive is the last line of defence against a scheduler (or a
// stale state) handing one GPU to two groups that exclude each other: no
// other claim may hold a seat on a group that shares a GPU with this one
// unless a profile involved allows overprovisioning. It judges by the
// GPUs recorded for the held claims, not by today's plan: a configuration
// that redefined a held group (same name, other GPUs) must not let a new
// group onto the GPUs the held claim still uses. GPUs a held claim fences
// (its seats not known, or its group defined so by an earlier
// configuration) go to no other group at all, overprovisioned or not:
// that is what the published taint says.
func checkExclusive(plan *planner.Plan, st *checkpoint.State, self types.UID, group *planner.Group) error {
	for uid, c := range st.Claims {
		if uid == self {
			continue
		}
		for _, dev := range c.Devices {
			if dev.AdminAccess {
				continue // monitoring holds no seat and excludes nothing
			}
			sameGroup := dev.GroupDevice == group.DeviceName() && slices.Equal(dev.GPUs, group.GPUs)
			if sameGroup || !slices.ContainsFunc(dev.GPUs, func(x int) bool { return slices.Contains(group.GPUs, x) }) {
				continue
			}
			if dev.Fenced || earlierConfiguration(plan, dev) {
				return fmt.Errorf("GPU(s) %s of group %s (%s) are fenced by claim %s, which holds them through group %s (GPUs %s) with %s; no group on them is handed out until that claim is released",
					group.GPUList(), group.Name, group.Profile.Name, describeClaim(st, uid), dev.Group, gpuList(dev.GPUs), fenceCause(dev))
			}
			if group.Profile.AllowOverprovision || allowsOverprovision(plan, dev.Profile) {
				continue
			}
			if group.Profile.MIG != nil && isMIG(plan, dev.Profile) {
				// MIG instances of several profiles share a GPU; NVML
				// refuses one whose placement overlaps another's.
				continue
			}
			return fmt.Errorf("GPU(s) %s of group %s (%s) are in use by claim %s through group %s (%s) on GPUs %s; groups that share a GPU exclude each other unless a profile involved allows overprovisioning",
				group.GPUList(), group.Name, group.Profile.Name, describeClaim(st, uid), dev.Group, dev.Profile, gpuList(dev.GPUs))
		}
	}
	return nil
}

// earlierConfiguration reports whether a held device's group is defined
// otherwise today, or not at all: the device fences its recorded GPUs.
func earlierConfiguration(plan *planner.Plan, dev checkpoint.Device) bool {
	today := groupToday(plan, dev.GroupDevice)
	return today == nil || !slices.Equal(today.GPUs, dev.GPUs)
}

// groupToday is today's group of a group device: one of the plan's
// groups, or a MIG profile's GPU as a group of one (g0-mig-1g-10gb).
func groupToday(plan *planner.Plan, groupDevice string) *planner.Group {
	if g := plan.GroupByDevice(groupDevice); g != nil {
		return g
	}
	for _, prof := range plan.Profiles {
		if prof.MIG == nil {
			continue
		}
		for _, g := range prof.MIG.GPUs {
			if g.Group.DeviceName() == groupDevice {
				return g.Group
			}
		}
	}
	return nil
}

// isMIG reports whether today's profile of that name is a MIG profile.
func isMIG(plan *planner.Plan, profile string) bool {
	p := plan.Profile(profile)
	return p != nil && p.MIG != nil
}

func fenceCause(dev checkpoint.Device) string {
	if dev.Fenced {
		return "seats that could not be recovered after the checkpoint was lost"
	}
	return "a definition of an earlier configuration"
}

// allowsOverprovision reports whether today's profile of that name allows
// overprovisioning; a profile the plan no longer has does not.
func allowsOverprovision(plan *planner.Plan, profile string) bool {
	p := plan.Profile(profile)
	return p != nil && p.AllowOverprovision
}

func describeClaim(st *checkpoint.State, uid types.UID) string {
	if c, ok := st.Claims[uid]; ok {
		return fmt.Sprintf("%s/%s (%s)", c.Namespace, c.Name, uid)
	}
	return string(uid)
}

// seatsConsumed is how many seats a share holds: its consumed "seats"
// capacity (the request policy's default, 1, when the claim asked none).
func seatsConsumed(result resourceapi.DeviceRequestAllocationResult, group *planner.Group) (int, error) {
	q, ok := result.ConsumedCapacity[draresources.SeatsCapacity]
	if !ok {
		return 1, nil
	}
	n, exact := q.AsInt64()
	if !exact || n < 1 || q.Cmp(*resource.NewQuantity(int64(group.Seats()), resource.DecimalSI)) > 0 {
		return 0, fmt.Errorf("device %s: consumed seats %s is not a whole number between 1 and %d", result.Device, q.String(), group.Seats())
	}
	return int(n), nil
}

// seatConfig resolves the opaque configuration for one result: class
// configurations first, then the claim's own, later ones winning; entries
// for other drivers are ignored, ours must decode.
func seatConfig(configs []resourceapi.DeviceAllocationConfiguration, result resourceapi.DeviceRequestAllocationResult) (*v1alpha1.SeatConfig, error) {
	cfg := &v1alpha1.SeatConfig{}
	cfg.SetDefaults()
	for _, source := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for i, c := range configs {
			if c.Source != source || c.Opaque == nil || c.Opaque.Driver != driver.Name {
				continue
			}
			if len(c.Requests) > 0 && !slices.ContainsFunc(c.Requests, func(r string) bool {
				return r == result.Request || r == resourceclaim.BaseRequestRef(result.Request)
			}) {
				continue
			}
			parsed, err := v1alpha1.DecodeSeatConfig(c.Opaque.Parameters.Raw)
			if err != nil {
				return nil, fmt.Errorf("config[%d] (from the %s): %w", i, strings.ToLower(string(source)), err)
			}
			cfg = parsed
		}
	}
	return cfg, nil
}
