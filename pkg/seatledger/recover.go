package seatledger

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// What a lost checkpoint is rebuilt from. The node has two records of the
// seats a claim holds besides the checkpoint, written from its entry:
//
//   - the claim's status (status.devices[].data), written a second after
//     the prepare, and not at all while the API server fails;
//   - the claim's CDI spec on disk, written before the prepare answers:
//     what its containers were given, in their KYB_* variables.
//
// Neither is trusted as written: each is checked against the claim's
// current allocation and the node's plan and inventory (the group of each
// allocated device, its GPUs and their UUIDs, the number of seats the
// device consumes, seats within the group's, generations of 1 or more),
// and the two must agree where both exist. A claim whose records fail is
// fenced (its group's seats all held, no seat handed out to it) and
// reported; a claim with no record at all was never given to a container,
// since every container starts from its claim's spec, and the kubelet
// prepares it again.

// recoverer rebuilds the record of a node whose checkpoint is lost, from
// the records the node keeps elsewhere. It holds no lock and changes
// nothing: it reads the API server and the CDI directory, and the ledger
// adopts what it returns under its lock.
type recoverer struct {
	opts  *Options
	index map[string]draresources.DeviceRef
}

// ourResults are the claim's allocation results on this driver and pool,
// in allocation order (the order a spec lists a request's seats in).
func (rc *recoverer) ourResults(claim *resourceapi.ResourceClaim) []resourceapi.DeviceRequestAllocationResult {
	var out []resourceapi.DeviceRequestAllocationResult
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == driver.Name && r.Pool == rc.opts.Pool {
			out = append(out, r)
		}
	}
	return out
}

func shareOf(r resourceapi.DeviceRequestAllocationResult) string {
	if r.ShareID == nil {
		return ""
	}
	return string(*r.ShareID)
}

// fromStatus reads the claim's devices from its status. present says the
// status records any of them; an error says why the record is not
// trusted.
func (rc *recoverer) fromStatus(claim *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult) (devs []checkpoint.Device, present bool, err error) {
	recorded := map[string]v1alpha1.SeatStatus{}
	var bad error
	for _, ds := range claim.Status.Devices {
		if ds.Driver != driver.Name || ds.Pool != rc.opts.Pool || ds.Data == nil {
			continue
		}
		present = true
		var s v1alpha1.SeatStatus
		if err := json.Unmarshal(ds.Data.Raw, &s); err != nil {
			bad = fmt.Errorf("the status of device %s does not decode: %w", ds.Device, err)
			continue
		}
		share := ""
		if ds.ShareID != nil {
			share = *ds.ShareID
		}
		recorded[ds.Device+"/"+share] = s
	}
	if !present || bad != nil {
		return nil, present, bad
	}
	for _, r := range results {
		if dev, ok := rc.adminDevice(claim, r); ok {
			devs = append(devs, dev)
			continue
		}
		s, ok := recorded[r.Device+"/"+shareOf(r)]
		if !ok {
			return nil, true, fmt.Errorf("the status records no seats for device %s", r.Device)
		}
		dev, err := rc.recordedDevice(claim, r, s)
		if err != nil {
			return nil, true, fmt.Errorf("the status of device %s: %w", r.Device, err)
		}
		devs = append(devs, dev)
	}
	return devs, true, nil
}

// fromSpec reads the claim's devices back from its CDI spec on disk. Every
// CDI device of a request carries the request's whole environment: its
// KYB_* variables list the request's seats device by device, in
// allocation order, each device taking as many entries as it holds seats.
func (rc *recoverer) fromSpec(claim *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult) (devs []checkpoint.Device, present bool, err error) {
	env, present, err := rc.opts.Specs.ReadEnv(claim.UID)
	if !present || err != nil {
		return nil, present, err
	}
	// The entries left to take, per request.
	type list struct{ groups, seats, gens []string }
	lists := map[string]*list{}
	for _, r := range results {
		cdiDevice := r.Device
		if share := shareOf(r); share != "" {
			cdiDevice += "-" + share
		}
		vars, ok := env[cdiDevice]
		if !ok {
			return nil, true, fmt.Errorf("the CDI spec has no device %s", cdiDevice)
		}
		ref, known := rc.index[r.Device]
		if !known {
			return nil, true, fmt.Errorf("device %s is not published by this node", r.Device)
		}
		if !containsAll(strings.Split(vars[containeredits.EnvNVIDIAVisibleDevices], ","), rc.uuids(ref.Group.GPUs)) {
			return nil, true, fmt.Errorf("the CDI spec of device %s does not give the container the GPUs of group %s", cdiDevice, ref.Group.Name)
		}
		req := resourceclaim.BaseRequestRef(r.Request)
		if lists[req] == nil {
			lists[req] = &list{groups: split(vars[containeredits.EnvGroup]), seats: split(vars[containeredits.EnvSeat]), gens: split(vars[containeredits.EnvGeneration])}
		}
		ls := lists[req]
		if dev, ok := rc.adminDevice(claim, r); ok {
			// One group entry, no seat.
			if len(ls.groups) == 0 || ls.groups[0] != ref.Group.Name || vars[containeredits.EnvAdminAccess] != "true" {
				return nil, true, fmt.Errorf("the CDI spec of device %s does not give admin access to group %s", cdiDevice, ref.Group.Name)
			}
			ls.groups = ls.groups[1:]
			devs = append(devs, dev)
			continue
		}
		n, err := rc.seatCount(r, ref)
		if err != nil {
			return nil, true, err
		}
		if len(ls.groups) < n || len(ls.seats) < n || len(ls.gens) < n {
			return nil, true, fmt.Errorf("the CDI spec lists fewer seats than the request's devices hold")
		}
		s := v1alpha1.SeatStatus{Profile: ref.Group.Profile.Name, Group: ref.Group.Name, GPUs: slices.Clone(ref.Group.GPUs), GPUUUIDs: rc.uuids(ref.Group.GPUs)}
		for i := range n {
			if ls.groups[i] != ref.Group.Name {
				return nil, true, fmt.Errorf("the CDI spec gives device %s a seat of group %s, not %s", cdiDevice, ls.groups[i], ref.Group.Name)
			}
			seat, err1 := strconv.Atoi(ls.seats[i])
			gen, err2 := strconv.ParseInt(ls.gens[i], 10, 64)
			if err1 != nil || err2 != nil {
				return nil, true, fmt.Errorf("the CDI spec of device %s has seat %q, generation %q", cdiDevice, ls.seats[i], ls.gens[i])
			}
			s.Seats, s.Generations = append(s.Seats, seat), append(s.Generations, gen)
		}
		ls.groups, ls.seats, ls.gens = ls.groups[n:], ls.seats[n:], ls.gens[n:]
		dev, err := rc.recordedDevice(claim, r, s)
		if err != nil {
			return nil, true, fmt.Errorf("the CDI spec of device %s: %w", cdiDevice, err)
		}
		devs = append(devs, dev)
	}
	for req, ls := range lists {
		if len(ls.groups) > 0 || len(ls.seats) > 0 || len(ls.gens) > 0 {
			return nil, true, fmt.Errorf("the CDI spec lists more seats for request %s than its devices hold", req)
		}
	}
	return devs, true, nil
}

// recordedDevice checks that s is a record of result on this node and
// makes it the result's entry.
func (rc *recoverer) recordedDevice(claim *resourceapi.ResourceClaim, result resourceapi.DeviceRequestAllocationResult, s v1alpha1.SeatStatus) (checkpoint.Device, error) {
	ref, known := rc.index[result.Device]
	if !known {
		return checkpoint.Device{}, fmt.Errorf("device %s is not published by this node", result.Device)
	}
	g := ref.Group
	n, err := rc.seatCount(result, ref)
	if err != nil {
		return checkpoint.Device{}, err
	}
	switch {
	case s.Group != g.Name || s.Profile != g.Profile.Name:
		return checkpoint.Device{}, fmt.Errorf("it names group %s (%s), but the device is group %s (%s)", s.Group, s.Profile, g.Name, g.Profile.Name)
	case !slices.Equal(s.GPUs, g.GPUs) || !slices.Equal(s.GPUUUIDs, rc.uuids(g.GPUs)):
		return checkpoint.Device{}, fmt.Errorf("it names GPUs %v (%v), but group %s is GPUs %v (%v)", s.GPUs, s.GPUUUIDs, g.Name, g.GPUs, rc.uuids(g.GPUs))
	case len(s.Seats) != n || len(s.Generations) != n:
		return checkpoint.Device{}, fmt.Errorf("it records %d seats and %d generations, but the device holds %d seats", len(s.Seats), len(s.Generations), n)
	}
	seen := map[int]bool{}
	for i, seat := range s.Seats {
		switch {
		case seat < 0 || seat >= g.Seats() || seen[seat]:
			return checkpoint.Device{}, fmt.Errorf("seat %d is not one of group %s's %d seats, or is listed twice", seat, g.Name, g.Seats())
		case ref.Seat >= 0 && seat != ref.Seat:
			return checkpoint.Device{}, fmt.Errorf("seat %d, but device %s is seat %d", seat, result.Device, ref.Seat)
		case s.Generations[i] < 1 || s.Generations[i] > checkpoint.MaxGeneration:
			return checkpoint.Device{}, fmt.Errorf("seat %d has generation %d, not between 1 and %d", seat, s.Generations[i], int64(checkpoint.MaxGeneration))
		}
		seen[seat] = true
	}
	cfg, err := seatConfig(claim.Status.Allocation.Devices.Config, result)
	if err != nil {
		return checkpoint.Device{}, err
	}
	// A sized seat's size is what its allocation consumed, whatever a
	// record says.
	s.Size = nil
	if sizes, sized := g.Sizes(); sized && ref.Seat < 0 {
		size, err := draresources.ConsumedSize(result, sizes)
		if err != nil {
			return checkpoint.Device{}, err
		}
		s.Size = &size
	}
	return newDevice(result, g, cfg, s), nil
}

// fencedDevices are the entries of a claim whose seats are not known: for
// each result, its group with no seats, fenced. A fenced entry holds the
// GPUs of today's group and every GPU the claim's records name: a group
// redefined since the claim was prepared gave its container other GPUs
// than today's group has. Where the records name a GPU this node does not
// know, or the spec cannot be read, every GPU is held.
func (rc *recoverer) fencedDevices(claim *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult) []checkpoint.Device {
	recorded, anyGPU := rc.recordedGPUs(claim)
	all := make([]int, len(rc.opts.Inventory.GPUs))
	for i, g := range rc.opts.Inventory.GPUs {
		all[i] = g.Index
	}
	var devs []checkpoint.Device
	for _, r := range results {
		if dev, ok := rc.adminDevice(claim, r); ok {
			devs = append(devs, dev) // no seats to lose
			continue
		}
		ref, known := rc.index[r.Device]
		if !known || anyGPU {
			dev := checkpoint.Device{
				Requests: []string{resourceclaim.BaseRequestRef(r.Request)}, Pool: r.Pool, Device: r.Device, ShareID: shareOf(r), GroupDevice: r.Device,
				SeatStatus: v1alpha1.SeatStatus{GPUs: all, GPUUUIDs: rc.uuids(all)}, CDIDevice: r.Device, Fenced: true,
			}
			if known {
				dev.GroupDevice, dev.Group, dev.Profile = ref.Group.DeviceName(), ref.Group.Name, ref.Group.Profile.Name
			}
			if dev.ShareID != "" {
				dev.CDIDevice += "-" + dev.ShareID
			}
			devs = append(devs, dev)
			continue
		}
		gpus := slices.Sorted(slices.Values(slices.Concat(ref.Group.GPUs, recorded)))
		gpus = slices.Compact(gpus)
		cfg := &v1alpha1.SeatConfig{}
		cfg.SetDefaults()
		dev := newDevice(r, ref.Group, cfg, v1alpha1.SeatStatus{
			Profile: ref.Group.Profile.Name, Group: ref.Group.Name, GPUs: gpus, GPUUUIDs: rc.uuids(gpus),
		})
		dev.Fenced = true
		devs = append(devs, dev)
	}
	return devs
}

// recordedGPUs are the GPUs a claim's records name: its status data, and
// its spec's visible devices (what its containers were given). anyGPU is
// true when a record names a GPU this node does not have, or the spec
// cannot be read. Status data that does not decode names nothing: no
// container was given a status.
func (rc *recoverer) recordedGPUs(claim *resourceapi.ResourceClaim) (gpus []int, anyGPU bool) {
	byUUID := map[string]int{}
	for _, g := range rc.opts.Inventory.GPUs {
		byUUID[g.UUID] = g.Index
	}
	addUUID := func(u string) {
		if x, ok := byUUID[u]; ok {
			gpus = append(gpus, x)
		} else {
			anyGPU = true
		}
	}
	for _, ds := range claim.Status.Devices {
		if ds.Driver != driver.Name || ds.Pool != rc.opts.Pool || ds.Data == nil {
			continue
		}
		var s v1alpha1.SeatStatus
		if json.Unmarshal(ds.Data.Raw, &s) != nil {
			continue
		}
		for _, x := range s.GPUs {
			if _, ok := rc.opts.Inventory.GPUByIndex(x); ok {
				gpus = append(gpus, x)
			} else {
				anyGPU = true
			}
		}
		for _, u := range s.GPUUUIDs {
			addUUID(u)
		}
	}
	env, present, err := rc.opts.Specs.ReadEnv(claim.UID)
	if present && err != nil {
		return nil, true
	}
	for _, vars := range env {
		for _, u := range split(vars[containeredits.EnvNVIDIAVisibleDevices]) {
			addUUID(u)
		}
	}
	return gpus, anyGPU
}

// specAgrees checks a claim's spec on disk, if it has one, against its
// entry: the spec has the entry's devices and no others, and each gives
// the seats, groups and generations the entry records for its request. A
// fenced entry's seats are not known: any spec agrees with it.
func (rc *recoverer) specAgrees(uid types.UID, c *checkpoint.Claim) error {
	if c.Fenced() {
		return nil
	}
	env, present, err := rc.opts.Specs.ReadEnv(uid)
	if err != nil || !present {
		return err
	}
	type lists struct{ groups, seats, gens []string }
	want := map[string]*lists{}
	for _, dev := range c.Devices {
		for _, r := range dev.Requests {
			if want[r] == nil {
				want[r] = &lists{}
			}
			ls := want[r]
			if dev.AdminAccess {
				ls.groups = append(ls.groups, dev.Group)
			}
			for i, seat := range dev.Seats {
				ls.groups = append(ls.groups, dev.Group)
				ls.seats = append(ls.seats, strconv.Itoa(seat))
				ls.gens = append(ls.gens, strconv.FormatInt(dev.Generations[i], 10))
			}
		}
	}
	if len(env) != len(c.Devices) {
		return fmt.Errorf("its CDI spec has %d devices, its entry %d", len(env), len(c.Devices))
	}
	for _, dev := range c.Devices {
		vars, ok := env[dev.CDIDevice]
		if !ok {
			return fmt.Errorf("its CDI spec has no device %s", dev.CDIDevice)
		}
		w := want[dev.Requests[0]]
		got := lists{split(vars[containeredits.EnvGroup]), split(vars[containeredits.EnvSeat]), split(vars[containeredits.EnvGeneration])}
		if !slices.Equal(got.groups, w.groups) || !slices.Equal(got.seats, w.seats) || !slices.Equal(got.gens, w.gens) {
			return fmt.Errorf("its CDI spec gives device %s seats %v of groups %v (generations %v), its entry seats %v of groups %v (generations %v)",
				dev.CDIDevice, got.seats, got.groups, got.gens, w.seats, w.groups, w.gens)
		}
	}
	return nil
}

// adminDevice is the entry of a result allocated with admin access on a
// device this node publishes: it needs no record, holding no seat.
func (rc *recoverer) adminDevice(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult) (checkpoint.Device, bool) {
	ref, known := rc.index[r.Device]
	if !isAdmin(r) || !known {
		return checkpoint.Device{}, false
	}
	cfg, err := seatConfig(claim.Status.Allocation.Devices.Config, r)
	if err != nil {
		cfg = &v1alpha1.SeatConfig{}
		cfg.SetDefaults()
	}
	return adminDevice(r, ref.Group, cfg, rc.uuids(ref.Group.GPUs)), true
}

// seatCount is how many seats the result holds: one of a per-seat device,
// else the seats it consumed.
func (rc *recoverer) seatCount(r resourceapi.DeviceRequestAllocationResult, ref draresources.DeviceRef) (int, error) {
	if ref.Seat >= 0 {
		return 1, nil
	}
	return seatsConsumed(r, ref.Group)
}

func (rc *recoverer) uuids(gpus []int) []string {
	out := make([]string, len(gpus))
	for i, x := range gpus {
		if x >= 0 && x < len(rc.opts.Inventory.GPUs) {
			out[i] = rc.opts.Inventory.GPUs[x].UUID
		}
	}
	return out
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
