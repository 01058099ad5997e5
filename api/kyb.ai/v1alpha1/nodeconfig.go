package v1alpha1

import (
	"regexp"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeConfigKind is the kind of a node configuration document.
const NodeConfigKind = "NodeConfig"

// NodeConfig says how a node's GPUs become groups and seats. All fields are
// optional: an empty document gives profiles 1x, 2x and 4x (where the node
// has enough GPUs), one seat per group, no overprovisioning, and groups
// derived from the topology.
//
// The same document serves every node of a DaemonSet, so a profile that a
// node cannot form (4x on a 2-GPU node) is not an error there: the node
// simply publishes no groups for it.
type NodeConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Profiles are the seat profiles the node offers; one DeviceClass and
	// one extended resource each.
	Profiles []Profile `json:"profiles,omitempty"`

	// Groups are GPU groups named by hand. A group serves every profile
	// whose group size equals its number of GPUs.
	Groups []Group `json:"groups,omitempty"`

	// Grouping says how the GPUs that no explicit group of a profile's size
	// covers are grouped: "auto" (default) forms groups from the topology,
	// "explicit" leaves them out of that profile.
	Grouping GroupingMode `json:"grouping,omitempty"`

	// AllocationPolicy orders the published devices, which is the order in
	// which the scheduler's first-fit allocator tries them: "pack"
	// (default) fills the GPUs of one larger group with small seats before
	// it touches the next, keeping whole 2x/4x groups free as long as
	// possible; "spread" puts consecutive seats on groups far apart.
	AllocationPolicy AllocationPolicy `json:"allocationPolicy,omitempty"`

	// Attributes lists the device attributes to publish. Each one costs the
	// scheduler time on every node it filters, so the default is the lean
	// set of attributes selectors use: profile, group, gpuIndices and
	// interconnect. "profile" is always required (the DeviceClasses select
	// on it).
	Attributes []AttributeName `json:"attributes,omitempty"`

	// UnavailableGroups says what the node publishes of a group that
	// cannot take another claim. "publish" (default): every group, always;
	// the published devices depend only on the node's GPUs, configuration
	// and health, never on the claims it holds, as the Cluster Autoscaler
	// (which copies a running node's slices into its template for new
	// nodes), monitoring with admin access and the allocator's own checks
	// expect; the scheduler's counters and capacities refuse what is
	// taken. "hideBlocked" (opt-in) leaves out a group that holds no seat
	// and is blocked because one of its GPUs is held through an
	// overlapping group (a 2x group while a 1x seat on one of its GPUs is
	// in use), which spares the scheduler a selector evaluation per such
	// group on every node it filters, at the cost that a busy node's
	// slices no longer describe what a new node of its kind offers.
	// Allocated groups are published in every mode. "hide", the former
	// default that also hid full groups, is read as "hideBlocked". Either
	// way overlapping groups exclude each other and seats are never handed
	// out twice.
	UnavailableGroups UnavailableGroupsMode `json:"unavailableGroups,omitempty"`

	// Health tunes how GPU faults turn into unhealthy groups.
	Health *HealthConfig `json:"health,omitempty"`
}

// Profile is one kind of seat: groups of GPUsPerGroup GPUs, each shared by
// SeatsPerGroup seats.
type Profile struct {
	// Resource is the extended resource name, such as kyb.ai/gpu-2x-seat.
	// The DeviceClass is named after it (gpu-2x-seat.kyb.ai) and maps it,
	// so pods that ask for the extended resource are served by DRA.
	Resource string `json:"resource"`

	// Name is the value of the device attribute "profile". Default: the
	// resource's name without "gpu-" and "-seat" (kyb.ai/gpu-2x-seat -> 2x).
	Name string `json:"name,omitempty"`

	// GPUsPerGroup is the group size: 1, 2, 4 or 8. Default: read from the
	// resource name ("-2x-" -> 2).
	GPUsPerGroup *int `json:"gpusPerGroup,omitempty"`

	// SeatsPerGroup is how many seats share one group. Default 1.
	SeatsPerGroup *int `json:"seatsPerGroup,omitempty"`

	// AllowOverprovision lets this profile's groups be in use while a group
	// of another profile that shares a GPU is in use too: the GPU is then
	// time-shared between them. Default false: groups that share a GPU
	// exclude each other while any of their seats is held.
	AllowOverprovision bool `json:"allowOverprovision,omitempty"`

	// GPUs restricts the profile to these GPU indices. Default: all GPUs.
	// On clusters without consumable capacity (and in the device-plugin
	// shim) profiles that must not overlap are laid out on disjoint GPUs;
	// disjoint GPU lists here decide that layout.
	GPUs []int `json:"gpus,omitempty"`

	// Sharing says how the seats of a group share its GPUs: time-slicing
	// (the default) or MPS with each seat's share of SMs and memory.
	Sharing *Sharing `json:"sharing,omitempty"`

	// MIG, when set, makes each seat a MIG instance of one MIG profile on
	// one GPU (mig.go). Default name: the resource's name with '.' as '-'
	// (kyb.ai/mig-1g.10gb -> mig-1g-10gb).
	MIG *MIGProfile `json:"mig,omitempty"`
}

// Group is a set of GPUs named by hand.
type Group struct {
	// Name is shown to workloads as KYB_GPU_GROUP and published as the
	// device attribute "group". Letters, digits and '-', at most 24.
	Name string `json:"name"`
	// GPUs are the GPU indices of the group.
	GPUs []int `json:"gpus"`
}

// GroupingMode says how GPUs outside explicit groups are grouped.
type GroupingMode string

const (
	// GroupingAuto derives groups from the topology.
	GroupingAuto GroupingMode = "auto"
	// GroupingExplicit uses only the groups listed in the config.
	GroupingExplicit GroupingMode = "explicit"
)

// AllocationPolicy says in which order the scheduler tries the groups.
type AllocationPolicy string

const (
	// PolicyPack fills one larger group's GPUs before touching the next.
	PolicyPack AllocationPolicy = "pack"
	// PolicySpread places consecutive seats on groups far apart.
	PolicySpread AllocationPolicy = "spread"
)

// UnavailableGroupsMode says whether groups that cannot take another claim
// are published.
type UnavailableGroupsMode string

const (
	// UnavailableGroupsPublish publishes every group (the default).
	UnavailableGroupsPublish UnavailableGroupsMode = "publish"
	// UnavailableGroupsHideBlocked leaves out of the ResourceSlices the
	// groups that hold no seat and are blocked by an overlapping group in
	// use.
	UnavailableGroupsHideBlocked UnavailableGroupsMode = "hideBlocked"
	// UnavailableGroupsHide is the former default, which hid full groups
	// as well; it is read as UnavailableGroupsHideBlocked.
	UnavailableGroupsHide UnavailableGroupsMode = "hide"
)

// AttributeName names a device attribute the driver can publish.
type AttributeName string

// The attributes the driver can publish. Unqualified names live in the
// driver's domain (gpu.kyb.ai/profile).
const (
	AttrProfile               AttributeName = "profile"
	AttrGroup                 AttributeName = "group"
	AttrGPUCount              AttributeName = "gpuCount"
	AttrGPUIndices            AttributeName = "gpuIndices"
	AttrInterconnect          AttributeName = "interconnect"
	AttrProductName           AttributeName = "productName"
	AttrArchitecture          AttributeName = "architecture"
	AttrCUDAComputeCapability AttributeName = "cudaComputeCapability"
	AttrDriverVersion         AttributeName = "driverVersion"
	AttrMemoryMiB             AttributeName = "memoryMiB"
	AttrPCIeRoot              AttributeName = "resource.kubernetes.io/pcieRoot"
	AttrNUMANode              AttributeName = "resource.kubernetes.io/numaNode"
)

// KnownAttributes lists every attribute in the order the driver publishes them.
var KnownAttributes = []AttributeName{
	AttrProfile, AttrGroup, AttrGPUCount, AttrGPUIndices, AttrInterconnect,
	AttrProductName, AttrArchitecture, AttrCUDAComputeCapability, AttrDriverVersion,
	AttrMemoryMiB, AttrPCIeRoot, AttrNUMANode,
}

// DefaultAttributes is the lean set published when the config names none.
// Each is there for a selector users write:
//
//	profile:      the DeviceClasses: device.attributes["gpu.kyb.ai"].profile == "2x"
//	group:        pin a named group: ....group == "G01"
//	gpuIndices:   pin GPUs or keep away from one: ....gpuIndices == "0,1"
//	interconnect: ask for NVLink: ....interconnect == "nvlink"
func DefaultAttributes() []AttributeName {
	return []AttributeName{AttrProfile, AttrGroup, AttrGPUIndices, AttrInterconnect}
}

// HealthConfig tunes the GPU health monitor.
type HealthConfig struct {
	// IgnoredXIDs are added to the built-in list of XIDs that do not make
	// a GPU unhealthy: 13, 31, 43, 45, 68 and 109 (the application's
	// fault) and 94 (an ECC error contained to one application). See
	// docs/health.md.
	IgnoredXIDs []int `json:"ignoredXIDs,omitempty"`
	// CriticalXIDs are removed from the built-in ignore list: they make a
	// GPU unhealthy even though the built-in list calls them application
	// errors.
	CriticalXIDs []int `json:"criticalXIDs,omitempty"`
	// RecoveryPeriod is how long a GPU marked unhealthy by a recoverable
	// event must answer NVML normally before it is healthy again. Default 5m.
	RecoveryPeriod *metav1.Duration `json:"recoveryPeriod,omitempty"`
	// GPULostEffect is the taint effect for a GPU that fell off the bus:
	// NoSchedule (default) or NoExecute (also evicts the pods using it).
	// Other faults always taint NoSchedule.
	GPULostEffect string `json:"gpuLostEffect,omitempty"`
}

// resourceSizeRE finds the group size in a resource name: gpu-2x-seat -> 2.
var resourceSizeRE = regexp.MustCompile(`(?:^|-)(\d+)x(?:-|$)`)

// ResourceBaseName is the part of an extended resource name after the
// domain: kyb.ai/gpu-2x-seat -> gpu-2x-seat.
func ResourceBaseName(resource string) string {
	if i := strings.LastIndexByte(resource, '/'); i >= 0 {
		return resource[i+1:]
	}
	return resource
}

// DefaultProfileName derives a profile name from its resource:
// kyb.ai/gpu-2x-seat -> 2x.
func DefaultProfileName(resource string) string {
	name := ResourceBaseName(resource)
	name = strings.TrimPrefix(name, "gpu-")
	name = strings.TrimSuffix(name, "-seat")
	return strings.ToLower(name)
}

// SizeFromResource reads the group size from a resource name ("-2x-" -> 2);
// 0 when the name carries none.
func SizeFromResource(resource string) int {
	m := resourceSizeRE.FindStringSubmatch(ResourceBaseName(resource))
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return 0
	}
	return n
}

// StandardProfile returns the built-in profile for groups of size GPUs:
// kyb.ai/gpu-<size>x-seat with one seat per group.
func StandardProfile(size int) Profile {
	return Profile{Resource: "kyb.ai/gpu-" + strconv.Itoa(size) + "x-seat"}
}

// SetDefaults fills every optional field that has a node-independent default.
// Profiles are not defaulted here: which sizes a node can form depends on
// its GPUs, so the planner supplies default profiles.
func (c *NodeConfig) SetDefaults() {
	if c.Grouping == "" {
		c.Grouping = GroupingAuto
	}
	if c.AllocationPolicy == "" {
		c.AllocationPolicy = PolicyPack
	}
	switch c.UnavailableGroups {
	case "":
		c.UnavailableGroups = UnavailableGroupsPublish
	case UnavailableGroupsHide:
		c.UnavailableGroups = UnavailableGroupsHideBlocked
	}
	if len(c.Attributes) == 0 {
		c.Attributes = DefaultAttributes()
	}
	for i := range c.Profiles {
		c.Profiles[i].SetDefaults()
	}
}

// SetDefaults fills the profile's derived fields.
func (p *Profile) SetDefaults() {
	if p.Name == "" {
		p.Name = p.defaultName()
	}
	if p.IsMIG() && p.GPUsPerGroup == nil {
		one := 1
		p.GPUsPerGroup = &one
	}
	if p.GPUsPerGroup == nil {
		if n := SizeFromResource(p.Resource); n > 0 {
			p.GPUsPerGroup = &n
		}
	}
	if p.SeatsPerGroup == nil {
		one := 1
		p.SeatsPerGroup = &one
	}
}

// Size is the profile's group size (0 before defaulting when unknown).
func (p *Profile) Size() int {
	if p.GPUsPerGroup == nil {
		return 0
	}
	return *p.GPUsPerGroup
}

// Seats is the number of seats per group (1 before defaulting).
func (p *Profile) Seats() int {
	if p.SeatsPerGroup == nil {
		return 1
	}
	return *p.SeatsPerGroup
}
