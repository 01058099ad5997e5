// Package seatview is the cluster's seats as an operator asks about them:
// per node, every group the node publishes, with its profile, GPUs, seats
// and state (free, in use, full, blocked by which group, unhealthy with
// which taint), who holds each seat, and the free seats per profile; of a
// sized profile's group, its memory and compute held and free, and each
// seat's size (sizes.go). It is
// computed from the API alone (the driver's ResourceSlices and the
// ResourceClaims with the seat data the plugin writes into their status),
// so that kubectl-kyb needs no access to the nodes. It relies on slices
// that describe every group (the default), not only the free ones.
package seatview

import (
	"cmp"
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/fragmentation"
)

// seatsCapacity is the capacity a seat of a shared group consumes, as the
// plugin publishes it.
const seatsCapacity = "seats"

// The states of a group.
const (
	StateFree      = "free"
	StateInUse     = "in-use"
	StateFull      = "full"
	StateBlocked   = "blocked"
	StateUnhealthy = "unhealthy"
)

// View is the JSON contract of `kubectl kyb seats -o json`. Fields are
// added, never renamed or removed.
type View struct {
	Nodes []Node `json:"nodes"`
	// Free is the free seats per profile across the nodes shown. Profiles
	// share GPUs: taking a free seat of one may block groups of another.
	Free []ProfileSeats `json:"free"`
	// Sizes is, per sized profile, its groups' memory and compute free
	// and in all across the nodes shown.
	Sizes []ProfileSizes `json:"sizes"`
	// Fragmentation is the nodes' fragmentation added up: free GPUs, and
	// of them those outside every free group of their node's largest
	// size. Its largestGroup is the largest of the nodes'.
	Fragmentation fragmentation.Measure `json:"fragmentation"`
}

// Node is one node's groups, in the order the node publishes them (the
// order the scheduler tries them).
type Node struct {
	Name   string  `json:"name"`
	Groups []Group `json:"groups"`
	// IncompletePools are the node's pools whose newest generation lacks
	// slices (the driver is publishing them): the scheduler allocates
	// none of their devices until every slice is there, so their groups
	// are not shown and their seats not counted.
	IncompletePools []IncompletePool `json:"incompletePools,omitempty"`
	// Fragmentation is the node's free GPUs, the size of its largest
	// group, and how many free GPUs are inside and outside its free
	// groups of that size (package fragmentation).
	Fragmentation fragmentation.Measure `json:"fragmentation"`
}

// Group is one group of a node.
type Group struct {
	// Device is the published device (g01-2x), or the group's devices'
	// common stem where the node publishes one device per seat.
	Device       string `json:"device"`
	Group        string `json:"group"`
	Profile      string `json:"profile"`
	GPUs         []int  `json:"gpus"`
	Interconnect string `json:"interconnect,omitempty"`
	// Seats is the group's seat count; HeldSeats how many are held.
	Seats     int `json:"seats"`
	HeldSeats int `json:"heldSeats"`
	// State is free, in-use, full, blocked (BlockedBy names the groups in
	// use that share a GPU with it) or unhealthy (Taints says why).
	State     string   `json:"state"`
	BlockedBy []string `json:"blockedBy,omitempty"`
	Taints    []string `json:"taints,omitempty"`
	// Held are the seats held, by seat.
	Held []Seat `json:"held"`
	// MIG is set for a MIG device: one instance of a MIG profile at one
	// placement of its GPU, a group of one seat.
	MIG *MIGInstance `json:"mig,omitempty"`
	// Sizes is set for a sized profile's group: its memory and compute,
	// held and free.
	Sizes *Sizes `json:"sizes,omitempty"`
}

// MIGInstance is the MIG instance a device stands for, from its published
// attributes.
type MIGInstance struct {
	// Profile is the MIG profile as nvidia-smi names it: 1g.10gb.
	Profile string `json:"profile"`
	// PlacementStart and PlacementSize are the instance's memory slices
	// on its GPU.
	PlacementStart int `json:"placementStart"`
	PlacementSize  int `json:"placementSize"`
	// Static: the instance is one the plugin did not make (an
	// administrator's partition), which a claim adopts and which is never
	// destroyed.
	Static bool `json:"static,omitempty"`
}

// Seat is one held seat, or several held by one claim whose seat numbers
// the plugin has not written yet.
type Seat struct {
	// Seat is the seat's number; null until the plugin has written the
	// claim's status (about a second after its prepare).
	Seat *int `json:"seat"`
	// Generation counts how often the seat was handed out.
	Generation int64 `json:"generation,omitempty"`
	// Claim is "namespace/name".
	Claim string `json:"claim"`
	// Pods are the pods the claim is reserved for, "namespace/name".
	Pods []string `json:"pods"`
	// MIGDeviceUUID is the MIG device made for the seat of a MIG device
	// (MIG-…), once the plugin has written the claim's status.
	MIGDeviceUUID string `json:"migDeviceUUID,omitempty"`
	// Size is a sized seat's memory (per GPU of its group) and compute:
	// what its claim's allocation consumed.
	Size *v1alpha1.SeatSize `json:"size,omitempty"`
}

// ProfileSeats counts seats of one profile.
type ProfileSeats struct {
	Profile string `json:"profile"`
	Free    int    `json:"free"`
	Total   int    `json:"total"`
}

// Options filter what is shown; the states are computed from every claim
// given.
type Options struct {
	// Node, when set, shows that node alone.
	Node string
	// Namespace, when set, lists only the holders of that namespace; the
	// others count in HeldSeats but are not named.
	Namespace string
}

// The attributes of a MIG device, as the plugin publishes them
// (pkg/draresources): its type "mig", its MIG profile and its placement.
const (
	attrType           = "type"
	attrMIGProfile     = "migProfile"
	attrPlacementStart = "placementStart"
	attrPlacementSize  = "placementSize"
	attrStatic         = "static"
)

// perSeat matches a device of the per-seat layout, g01-2x-seat-1.
var perSeat = regexp.MustCompile(`^(.+)-seat-([0-9]+)$`)

// groupKey identifies a group on a node.
type groupKey struct{ node, device string }

// Build computes the view from the driver's ResourceSlices and every
// ResourceClaim. Of each pool it takes the slices of the newest generation
// alone, and only when all of them are there, as the scheduler does
// (pools.go).
func Build(resourceSlices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim, opts Options) *View {
	devices := map[string][]string{} // node -> group devices, in published order
	groups := map[groupKey]*Group{}
	// needs are what each group consumes of its node's shared counters,
	// caps the counters' values, to find the groups held ones block.
	needs := map[groupKey]counterUse{}
	caps := map[string]counterUse{}
	seatDevices := map[groupKey]map[string]int{} // device name -> seat, per-seat layout
	var own []resourceapi.ResourceSlice
	for _, s := range resourceSlices {
		if s.Spec.Driver == driver.Name {
			own = append(own, s)
		}
	}
	slices.SortStableFunc(own, func(a, b resourceapi.ResourceSlice) int { return cmp.Compare(a.Name, b.Name) })
	newest, incomplete := gatherPools(own)
	for name := range incomplete {
		if opts.Node == "" || name == opts.Node {
			devices[name] = []string{}
		}
	}
	for _, s := range newest {
		if s.Spec.NodeName == nil {
			continue
		}
		name := *s.Spec.NodeName
		if opts.Node != "" && name != opts.Node {
			continue
		}
		if _, seen := devices[name]; !seen {
			devices[name] = []string{}
		}
		if caps[name] == nil {
			caps[name] = counterUse{}
		}
		addCapacities(caps[name], s)
		for _, d := range s.Spec.Devices {
			device, seat := d.Name, -1
			if m := perSeat.FindStringSubmatch(d.Name); m != nil {
				device = m[1]
				seat, _ = strconv.Atoi(m[2])
			}
			key := groupKey{name, device}
			g := groups[key]
			if g == nil {
				g = &Group{Device: device, Group: str(d, v1alpha1.AttrGroup), Profile: str(d, v1alpha1.AttrProfile),
					GPUs: gpuList(str(d, v1alpha1.AttrGPUIndices)), Interconnect: str(d, v1alpha1.AttrInterconnect), Held: []Seat{}}
				if str(d, attrType) == "mig" {
					g.MIG = &MIGInstance{Profile: str(d, attrMIGProfile), PlacementStart: integer(d, attrPlacementStart), PlacementSize: integer(d, attrPlacementSize)}
					if a, ok := d.Attributes[attrStatic]; ok && a.BoolValue != nil {
						g.MIG.Static = *a.BoolValue
					}
				}
				if seat < 0 {
					g.Sizes = deviceSizes(d)
				}
				groups[key] = g
				devices[name] = append(devices[name], device)
				needs[key] = consumption(d)
			}
			if seat >= 0 {
				if seatDevices[key] == nil {
					seatDevices[key] = map[string]int{}
				}
				seatDevices[key][d.Name] = seat
				g.Seats++
			} else if c, ok := d.Capacity[seatsCapacity]; ok {
				g.Seats = int(c.Value.Value())
			} else {
				g.Seats = 1
			}
			for _, t := range d.Taints {
				text := t.Key + "=" + t.Value + ":" + string(t.Effect)
				if !slices.Contains(g.Taints, text) {
					g.Taints = append(g.Taints, text)
				}
			}
		}
	}
	holders(groups, seatDevices, claims, opts)
	v := &View{Nodes: []Node{}, Free: []ProfileSeats{}, Sizes: []ProfileSizes{}}
	free := map[string]*ProfileSeats{}
	var profiles []string
	inUse := map[string][]groupKey{}
	used := map[string]counterUse{}
	for key, g := range groups {
		if g.HeldSeats > 0 {
			inUse[key.node] = append(inUse[key.node], key)
			if used[key.node] == nil {
				used[key.node] = counterUse{}
			}
			used[key.node].add(needs[key])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(devices)) {
		n := Node{Name: name, Groups: []Group{}, IncompletePools: incomplete[name]}
		// A MIG profile's seats are counted as the allocator would hand
		// them out one after the other: placements overlap and a GPU's
		// seats of a profile may be fewer than its placements, so its
		// devices do not add up.
		migAll, migFree := map[string][]counterUse{}, map[string][]counterUse{}
		for _, device := range devices[name] {
			key := groupKey{name, device}
			g := groups[key]
			settle(g, key, inUse[name], needs, caps[name], used[name])
			if g.Sizes != nil {
				g.Sizes.settleFree(g.State)
				v.Sizes = addSizes(v.Sizes, g.Profile, g.Sizes)
			}
			n.Groups = append(n.Groups, *g)
			p := free[g.Profile]
			if p == nil {
				p = &ProfileSeats{Profile: g.Profile}
				free[g.Profile] = p
				profiles = append(profiles, g.Profile)
			}
			if g.MIG != nil {
				migAll[g.Profile] = append(migAll[g.Profile], needs[key])
				if g.State == StateFree {
					migFree[g.Profile] = append(migFree[g.Profile], needs[key])
				}
				continue
			}
			p.Total += g.Seats
			if g.State == StateFree || g.State == StateInUse {
				p.Free += g.Seats - g.HeldSeats
			}
		}
		for profile, all := range migAll {
			free[profile].Total += fitMore(caps[name], nil, all)
			free[profile].Free += fitMore(caps[name], used[name], migFree[profile])
		}
		n.Fragmentation = measure(name, devices[name], groups, needs, caps[name])
		v.Fragmentation.Add(n.Fragmentation)
		v.Nodes = append(v.Nodes, n)
	}
	slices.SortFunc(profiles, compareProfiles)
	for _, p := range profiles {
		v.Free = append(v.Free, *free[p])
	}
	slices.SortFunc(v.Sizes, func(a, b ProfileSizes) int { return compareProfiles(a.Profile, b.Profile) })
	return v
}

// holders records every claim allocated from the groups, with its seats.
func holders(groups map[groupKey]*Group, seatDevices map[groupKey]map[string]int, claims []resourceapi.ResourceClaim, opts Options) {
	for _, cl := range claims {
		if cl.Status.Allocation == nil {
			continue
		}
		name := cl.Namespace + "/" + cl.Name
		var pods []string
		for _, r := range cl.Status.ReservedFor {
			if r.Resource == "pods" {
				pods = append(pods, cl.Namespace+"/"+r.Name)
			}
		}
		if pods == nil {
			pods = []string{}
		}
		written := seatData(cl)
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.Driver != driver.Name || (r.AdminAccess != nil && *r.AdminAccess) {
				continue // admin access (monitoring) holds no seat
			}
			device, perSeatIndex := r.Device, -1
			if m := perSeat.FindStringSubmatch(r.Device); m != nil {
				device = m[1]
				perSeatIndex, _ = strconv.Atoi(m[2])
			}
			g := groups[groupKey{r.Pool, device}]
			if g == nil {
				continue // a node not shown, or a device it no longer publishes
			}
			n := 1
			if q, ok := r.ConsumedCapacity[seatsCapacity]; ok {
				n = int(q.Value())
			}
			g.HeldSeats += n
			var size *v1alpha1.SeatSize
			if g.Sizes != nil {
				s := g.Sizes.consumed(r)
				g.Sizes.hold(s)
				size = &s
			}
			if opts.Namespace != "" && cl.Namespace != opts.Namespace {
				continue
			}
			var share string
			if r.ShareID != nil {
				share = string(*r.ShareID)
			}
			status, ok := written[r.Device+"/"+share]
			switch {
			case ok && len(status.Seats) == len(status.Generations):
				for i, s := range status.Seats {
					g.Held = append(g.Held, Seat{Seat: &s, Generation: status.Generations[i], Claim: name, Pods: pods, MIGDeviceUUID: status.MIGDeviceUUID, Size: size})
				}
			case perSeatIndex >= 0:
				g.Held = append(g.Held, Seat{Seat: &perSeatIndex, Claim: name, Pods: pods})
			default:
				for range n {
					g.Held = append(g.Held, Seat{Claim: name, Pods: pods, Size: size})
				}
			}
		}
	}
	for _, g := range groups {
		slices.SortStableFunc(g.Held, func(a, b Seat) int {
			if a.Seat == nil || b.Seat == nil {
				return cmp.Compare(b2i(a.Seat == nil), b2i(b.Seat == nil))
			}
			return cmp.Compare(*a.Seat, *b.Seat)
		})
	}
}

// deviceStatus is the data the plugin writes into a claim's status for a
// device: its seats and, for a MIG device, the MIG device made for it.
type deviceStatus struct {
	v1alpha1.SeatStatus
	MIGDeviceUUID string `json:"migDeviceUUID,omitempty"`
}

// seatData is the seat data the plugin wrote into a claim's status, by
// device and share.
func seatData(cl resourceapi.ResourceClaim) map[string]deviceStatus {
	out := map[string]deviceStatus{}
	for _, d := range cl.Status.Devices {
		if d.Driver != driver.Name || d.Data == nil {
			continue
		}
		var s deviceStatus
		if err := json.Unmarshal(d.Data.Raw, &s); err == nil {
			out[d.Device+"/"+shareID(d.ShareID)] = s
		}
	}
	return out
}

// settle decides a group's state: unhealthy first (no new claim lands
// there), then full (every seat held, or on a sized group no memory or
// compute left for another claim), in use, blocked by a held group that
// shares a counter (a GPU), or free.
func settle(g *Group, key groupKey, inUse []groupKey, needs map[groupKey]counterUse, caps, used counterUse) {
	for _, t := range g.Taints {
		if strings.HasSuffix(t, ":NoSchedule") || strings.HasSuffix(t, ":NoExecute") {
			g.State = StateUnhealthy
			return
		}
	}
	switch {
	case g.HeldSeats >= g.Seats || g.Sizes.exhausted():
		g.State = StateFull
		return
	case g.HeldSeats > 0:
		g.State = StateInUse
		return
	}
	full := over(caps, used, needs[key])
	for _, other := range inUse {
		if other != key && slices.ContainsFunc(full, func(c string) bool { return needs[other][c] > 0 }) {
			g.BlockedBy = append(g.BlockedBy, other.device)
		}
	}
	g.State = StateFree
	if len(g.BlockedBy) > 0 {
		slices.Sort(g.BlockedBy)
		g.State = StateBlocked
	}
}

func str(d resourceapi.Device, name v1alpha1.AttributeName) string {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func integer(d resourceapi.Device, name string) int {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.IntValue != nil {
		return int(*a.IntValue)
	}
	return 0
}

func gpuList(s string) []int {
	out := []int{}
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func shareID(id *string) string {
	if id == nil {
		return ""
	}
	return *id
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// compareProfiles orders profiles by their size (1x, 2x, 4x, 2x-train
// after 2x), then by name.
func compareProfiles(a, b string) int {
	size := func(p string) int {
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.SplitN(p, "-", 2)[0], "x"))
		return n
	}
	return cmp.Or(cmp.Compare(size(a), size(b)), cmp.Compare(a, b))
}
