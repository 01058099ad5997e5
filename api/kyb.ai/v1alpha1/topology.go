package v1alpha1

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// NodeTopologyKind is the kind of a simulated node description.
const NodeTopologyKind = "NodeTopology"

// MaxNVLinks is the number of NVLink ports a GPU has at most (NVML's
// NVLINK_MAX_LINKS).
const MaxNVLinks = 18

// nvidiaMajor is the character major the NVIDIA driver registers for the
// GPUs and nvidiactl; unlike nvidia-uvm's and nvidia-caps', it is fixed.
const nvidiaMajor = 195

// NodeTopology describes the GPUs of a simulated node: what NVML would
// report on a real one. The driver serves it through the same NVML
// interface as real hardware, so every code path above NVML runs unchanged.
//
//	apiVersion: kyb.ai/v1alpha1
//	kind: NodeTopology
//	driverVersion: "580.95.05"
//	defaults: {productName: NVIDIA L40S, architecture: ada, cudaComputeCapability: "8.9", memoryMiB: 46068}
//	gpus:
//	- {index: 0, numaNode: 0, pcieRoot: pci0000:00, pcieSwitch: sw0}
//	- {index: 1, numaNode: 0, pcieRoot: pci0000:00, pcieSwitch: sw0, nvlinks: [{peer: 0, links: 4}]}
//
// Links are listed on both GPUs of a pair and must agree.
type NodeTopology struct {
	metav1.TypeMeta `json:",inline"`

	// DriverVersion is the NVIDIA driver version NVML reports. Default 580.95.05.
	DriverVersion string `json:"driverVersion,omitempty"`
	// CUDADriverVersion is the CUDA version of the driver, "major.minor". Default 13.0.
	CUDADriverVersion string `json:"cudaDriverVersion,omitempty"`
	// NVSwitch, when set, connects every GPU to an NVSwitch fabric with
	// LinksPerGPU links each: every pair of GPUs then talks over NVLink.
	NVSwitch *NVSwitch `json:"nvswitch,omitempty"`
	// UVMMajor is the character-device major of /dev/nvidia-uvm, which the
	// kernel assigns at load time on a real node. Default 511.
	UVMMajor *int64 `json:"uvmMajor,omitempty"`
	// CapsMajor is the character-device major of the MIG capability nodes
	// (/dev/nvidia-caps/nvidia-cap<M>), also assigned at load time. Default
	// 238. The node lists both in its /proc/devices, as a real node's
	// kernel does (an H200 listed nvidia-uvm 238 and nvidia-caps 241).
	CapsMajor *int64 `json:"capsMajor,omitempty"`
	// Defaults fill the properties a GPU entry leaves out.
	Defaults *GPUProperties `json:"defaults,omitempty"`
	// GPUs are the node's GPUs, indexed 0..n-1.
	GPUs []SimulatedGPU `json:"gpus"`
}

// NVSwitch describes an NVSwitch fabric.
type NVSwitch struct {
	LinksPerGPU int `json:"linksPerGPU"`
}

// GPUProperties are the properties a GPU shares with others of its model.
type GPUProperties struct {
	// ProductName as NVML reports it, such as "NVIDIA H100 80GB HBM3".
	ProductName string `json:"productName,omitempty"`
	// Architecture: kepler, maxwell, pascal, volta, turing, ampere, ada,
	// hopper or blackwell.
	Architecture string `json:"architecture,omitempty"`
	// CUDAComputeCapability, "major.minor", such as "9.0".
	CUDAComputeCapability string `json:"cudaComputeCapability,omitempty"`
	// MemoryMiB is the GPU's memory.
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	// MIG, where set, makes the GPU MIG-capable with this geometry
	// (topology_mig.go). Default: the simulated node's table of the
	// product, where it has one.
	MIG *SimulatedMIG `json:"mig,omitempty"`
}

// SimulatedGPU is one GPU of a simulated node.
type SimulatedGPU struct {
	GPUProperties `json:",inline"`

	// Index is the NVML index.
	Index int `json:"index"`
	// UUID, "GPU-<uuid>". Default: derived from the node name and index,
	// so that simulated nodes of one cluster have distinct UUIDs.
	UUID string `json:"uuid,omitempty"`
	// Minor is the minor number of /dev/nvidia<minor>. Default: the index.
	Minor *int `json:"minor,omitempty"`
	// PCIBusID, "dddd:bb:dd.f". Default: derived from the index.
	PCIBusID string `json:"pciBusID,omitempty"`
	// NUMANode the GPU is attached to. Default 0.
	NUMANode *int `json:"numaNode,omitempty"`
	// PCIeRoot is the PCIe root complex (host bridge), as the kernel names
	// it ("pci0000:00"). Default pci0000:00.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// PCIeSwitch names the PCIe switch the GPU sits behind; GPUs with the
	// same name share it. Empty: directly on the root port.
	PCIeSwitch string `json:"pcieSwitch,omitempty"`
	// NVLinks are the direct NVLink connections to other GPUs.
	NVLinks []NVLink `json:"nvlinks,omitempty"`
}

// NVLink is a direct connection of Links NVLink ports to GPU Peer.
type NVLink struct {
	Peer  int `json:"peer"`
	Links int `json:"links"`
}

// The majors a simulated node's nvidia-uvm and nvidia-caps get where its
// description leaves them out.
const (
	defaultUVMMajor  = 511
	defaultCapsMajor = 238
)

// KnownArchitectures are the architecture names NVML distinguishes.
var KnownArchitectures = []string{"kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"}

var (
	pciBusIDRE   = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	ccRE         = regexp.MustCompile(`^\d+\.\d+$`)
	gpuUUIDRE    = regexp.MustCompile(`^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	driverVerRE  = regexp.MustCompile(`^\d+\.\d+(\.\d+)?$`)
	pcieRootRE   = regexp.MustCompile(`^pci[0-9a-f]{4,8}:[0-9a-f]{2}$`)
	switchNameRE = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]*$`)
)

// SetDefaults fills what the description leaves out. Call after Validate.
func (t *NodeTopology) SetDefaults() {
	if t.DriverVersion == "" {
		t.DriverVersion = "580.95.05"
	}
	if t.CUDADriverVersion == "" {
		t.CUDADriverVersion = "13.0"
	}
	if t.UVMMajor == nil {
		m := int64(defaultUVMMajor)
		t.UVMMajor = &m
	}
	if t.CapsMajor == nil {
		m := int64(defaultCapsMajor)
		t.CapsMajor = &m
	}
	for i := range t.GPUs {
		g := &t.GPUs[i]
		if t.Defaults != nil {
			g.GPUProperties = mergeProps(g.GPUProperties, *t.Defaults)
		}
		if g.Minor == nil {
			m := g.Index
			g.Minor = &m
		}
		if g.PCIBusID == "" {
			g.PCIBusID = fmt.Sprintf("0000:%02x:00.0", 0x18+g.Index)
		}
		if g.NUMANode == nil {
			n := 0
			g.NUMANode = &n
		}
		if g.PCIeRoot == "" {
			g.PCIeRoot = "pci0000:00"
		}
	}
}

// Validate refuses a malformed or contradictory description, naming the
// place: duplicate indices, UUIDs, minors or bus IDs, links to GPUs that do
// not exist, and links that the two GPUs of a pair do not agree on.
func (t *NodeTopology) Validate() error {
	var errs FieldErrors
	t.validateNode(&errs)
	if len(t.GPUs) == 0 {
		errs.Add(field.NewPath("gpus"), "required: a node has at least one GPU")
		return errs.Err()
	}
	ids := gpuIdentities{byIndex: map[int]int{}, uuids: seen[string]{}, minors: seen[int]{}, busIDs: seen[string]{}}
	for i := range t.GPUs {
		t.validateGPU(i, &ids, &errs)
	}
	t.validateSwitchRoots(&errs)
	validateNVLinks(t, ids.byIndex, &errs)
	return errs.Err()
}

// validateNode checks the fields that describe the node as a whole.
func (t *NodeTopology) validateNode(errs *FieldErrors) {
	if t.APIVersion != "" && t.APIVersion != APIVersion {
		errs.Add(field.NewPath("apiVersion"), "must be %q, not %q", APIVersion, t.APIVersion)
	}
	if t.Kind != "" && t.Kind != NodeTopologyKind {
		errs.Add(field.NewPath("kind"), "must be %q, not %q", NodeTopologyKind, t.Kind)
	}
	if t.DriverVersion != "" && !driverVerRE.MatchString(t.DriverVersion) {
		errs.Add(field.NewPath("driverVersion"), "%q is not a driver version such as 580.95.05", t.DriverVersion)
	}
	if t.CUDADriverVersion != "" && !ccRE.MatchString(t.CUDADriverVersion) {
		errs.Add(field.NewPath("cudaDriverVersion"), "%q is not a CUDA version such as 13.0", t.CUDADriverVersion)
	}
	if t.NVSwitch != nil && (t.NVSwitch.LinksPerGPU < 1 || t.NVSwitch.LinksPerGPU > MaxNVLinks) {
		errs.Add(field.NewPath("nvswitch", "linksPerGPU"), "must be between 1 and %d, not %d", MaxNVLinks, t.NVSwitch.LinksPerGPU)
	}
	// A kernel gives each driver a major of its own. The majors are
	// checked as SetDefaults will leave them: one left out gets its
	// default, which the other may have been set to (uvmMajor 238, the
	// real H200's, is capsMajor's default).
	majors := map[int64]string{nvidiaMajor: "the NVIDIA driver's own major"}
	for _, m := range []struct {
		name  string
		major *int64
		def   int64
	}{{"uvmMajor", t.UVMMajor, defaultUVMMajor}, {"capsMajor", t.CapsMajor, defaultCapsMajor}} {
		switch {
		case m.major == nil && majors[m.def] != "":
			errs.Add(field.NewPath(m.name), "left out, it defaults to %d, which is already %s: set it to a major of its own", m.def, majors[m.def])
		case m.major == nil:
			majors[m.def] = m.name + " (its default)"
		case *m.major < 1 || *m.major > 4095:
			errs.Add(field.NewPath(m.name), "must be a device major between 1 and 4095, not %d", *m.major)
		case majors[*m.major] != "":
			errs.Add(field.NewPath(m.name), "%d is already %s", *m.major, majors[*m.major])
		default:
			majors[*m.major] = m.name
		}
	}
	if t.Defaults != nil {
		validateGPUProperties(t.Defaults, field.NewPath("defaults"), errs)
	}
}

// seen remembers which GPU first used each value of a field that must be
// unique, so that the second is reported with the first.
type seen[K comparable] map[K]int

// claim records that GPU i uses key; shown is how the error names it.
func (s seen[K]) claim(key K, shown string, i int, path *field.Path, errs *FieldErrors) {
	if j, dup := s[key]; dup {
		errs.Add(path, "%s is already used by gpus[%d]", shown, j)
		return
	}
	s[key] = i
}

// gpuIdentities are the fields by which GPUs must differ.
type gpuIdentities struct {
	// byIndex maps each valid index to its GPU's position in the list.
	byIndex map[int]int
	uuids   seen[string]
	minors  seen[int]
	busIDs  seen[string]
}

// validateGPU checks gpus[i]: its identity (index, UUID, minor, bus ID,
// each unique), its PCIe placement and its model properties.
func (t *NodeTopology) validateGPU(i int, ids *gpuIdentities, errs *FieldErrors) {
	g := &t.GPUs[i]
	path := field.NewPath("gpus").Index(i)
	switch j, dup := ids.byIndex[g.Index]; {
	case g.Index < 0 || g.Index >= len(t.GPUs):
		errs.Add(path.Child("index"), "must be between 0 and %d (indices run from 0 without gaps), not %d", len(t.GPUs)-1, g.Index)
	case dup:
		errs.Add(path.Child("index"), "index %d is already used by gpus[%d]", g.Index, j)
	default:
		ids.byIndex[g.Index] = i
	}
	if g.UUID != "" {
		if !gpuUUIDRE.MatchString(g.UUID) {
			errs.Add(path.Child("uuid"), "%q is not a GPU UUID such as GPU-8d7a1c2e-0f4b-4c6e-9a1d-3b5f7e9c0a12", g.UUID)
		} else {
			ids.uuids.claim(strings.ToLower(g.UUID), "UUID "+g.UUID, i, path.Child("uuid"), errs)
		}
	}
	if g.Minor != nil {
		if *g.Minor < 0 || *g.Minor > 254 {
			errs.Add(path.Child("minor"), "must be between 0 and 254 (255 is /dev/nvidiactl), not %d", *g.Minor)
		} else {
			ids.minors.claim(*g.Minor, fmt.Sprintf("minor %d", *g.Minor), i, path.Child("minor"), errs)
		}
	}
	if g.PCIBusID != "" {
		if !pciBusIDRE.MatchString(g.PCIBusID) {
			errs.Add(path.Child("pciBusID"), "%q is not a PCI bus ID such as 0000:18:00.0 (lower-case hex)", g.PCIBusID)
		} else {
			ids.busIDs.claim(g.PCIBusID, "bus ID "+g.PCIBusID, i, path.Child("pciBusID"), errs)
		}
	}
	if g.NUMANode != nil && (*g.NUMANode < 0 || *g.NUMANode > 63) {
		errs.Add(path.Child("numaNode"), "must be between 0 and 63, not %d", *g.NUMANode)
	}
	if g.PCIeRoot != "" && !pcieRootRE.MatchString(g.PCIeRoot) {
		errs.Add(path.Child("pcieRoot"), "%q is not a PCIe root such as pci0000:00", g.PCIeRoot)
	}
	if g.PCIeSwitch != "" && !switchNameRE.MatchString(g.PCIeSwitch) {
		errs.Add(path.Child("pcieSwitch"), "%q: use letters, digits, '-', '_' and '.'", g.PCIeSwitch)
	}
	validateGPUProperties(&g.GPUProperties, path, errs)
	props := g.GPUProperties
	if t.Defaults != nil {
		props = mergeProps(props, *t.Defaults)
	}
	for _, required := range []struct {
		name  string
		unset bool
	}{
		{"productName", props.ProductName == ""},
		{"architecture", props.Architecture == ""},
		{"cudaComputeCapability", props.CUDAComputeCapability == ""},
		{"memoryMiB", props.MemoryMiB == 0},
	} {
		if required.unset {
			errs.Add(path.Child(required.name), "required (here or in defaults)")
		}
	}
}

// validateSwitchRoots refuses a PCIe switch behind two root complexes:
// switch names are local to a root complex.
func (t *NodeTopology) validateSwitchRoots(errs *FieldErrors) {
	switchRoot := map[string]string{}
	for i, g := range t.GPUs {
		if g.PCIeSwitch == "" {
			continue
		}
		root := g.PCIeRoot
		if root == "" {
			root = "pci0000:00"
		}
		if r, ok := switchRoot[g.PCIeSwitch]; ok && r != root {
			errs.Add(field.NewPath("gpus").Index(i).Child("pcieSwitch"), "switch %q is behind root %s on another GPU, not %s", g.PCIeSwitch, r, root)
		}
		switchRoot[g.PCIeSwitch] = root
	}
}

// mergeProps is p with what it leaves out taken from d.
func mergeProps(p, d GPUProperties) GPUProperties {
	if p.ProductName == "" {
		p.ProductName = d.ProductName
	}
	if p.Architecture == "" {
		p.Architecture = d.Architecture
	}
	if p.CUDAComputeCapability == "" {
		p.CUDAComputeCapability = d.CUDAComputeCapability
	}
	if p.MemoryMiB == 0 {
		p.MemoryMiB = d.MemoryMiB
	}
	if p.MIG == nil {
		p.MIG = d.MIG
	}
	return p
}

func validateGPUProperties(p *GPUProperties, path *field.Path, errs *FieldErrors) {
	if p.Architecture != "" && !slices.Contains(KnownArchitectures, p.Architecture) {
		errs.Add(path.Child("architecture"), "unknown architecture %q; known: %s", p.Architecture, strings.Join(KnownArchitectures, ", "))
	}
	if p.CUDAComputeCapability != "" && !ccRE.MatchString(p.CUDAComputeCapability) {
		errs.Add(path.Child("cudaComputeCapability"), "%q is not major.minor, such as 9.0", p.CUDAComputeCapability)
	}
	if p.MemoryMiB < 0 {
		errs.Add(path.Child("memoryMiB"), "must be positive, not %d", p.MemoryMiB)
	}
	if len(p.ProductName) > 64 {
		errs.Add(path.Child("productName"), "is longer than 64 characters")
	}
	if p.MIG != nil {
		validateMIGGeometry(p.MIG, path.Child("mig"), errs)
	}
}

func validateNVLinks(t *NodeTopology, byIndex map[int]int, errs *FieldErrors) {
	type pair struct{ a, b int }
	declared := map[pair]int{}
	where := map[pair]*field.Path{}
	for i, g := range t.GPUs {
		total := 0
		if t.NVSwitch != nil {
			total = t.NVSwitch.LinksPerGPU
		}
		peers := map[int]int{}
		for j, l := range g.NVLinks {
			path := field.NewPath("gpus").Index(i).Child("nvlinks").Index(j)
			if _, ok := byIndex[l.Peer]; !ok {
				errs.Add(path.Child("peer"), "GPU %d does not exist on this node (%d GPUs)", l.Peer, len(t.GPUs))
				continue
			}
			if l.Peer == g.Index {
				errs.Add(path.Child("peer"), "a GPU cannot link to itself")
				continue
			}
			if k, dup := peers[l.Peer]; dup {
				errs.Add(path.Child("peer"), "GPU %d is already listed at nvlinks[%d]; give the total link count once", l.Peer, k)
				continue
			}
			peers[l.Peer] = j
			if l.Links < 1 || l.Links > MaxNVLinks {
				errs.Add(path.Child("links"), "must be between 1 and %d, not %d", MaxNVLinks, l.Links)
				continue
			}
			total += l.Links
			declared[pair{g.Index, l.Peer}] = l.Links
			where[pair{g.Index, l.Peer}] = path
		}
		if total > MaxNVLinks {
			errs.Add(field.NewPath("gpus").Index(i).Child("nvlinks"), "GPU %d uses %d NVLink ports in all (NVSwitch included); a GPU has at most %d", g.Index, total, MaxNVLinks)
		}
	}
	var keys []pair
	for p := range declared {
		keys = append(keys, p)
	}
	slices.SortFunc(keys, func(x, y pair) int {
		if x.a != y.a {
			return x.a - y.a
		}
		return x.b - y.b
	})
	for _, p := range keys {
		n := declared[p]
		back, ok := declared[pair{p.b, p.a}]
		switch {
		case !ok:
			errs.Add(where[p], "GPU %d lists %d links to GPU %d, but GPU %d lists none back; links are symmetric, list them on both", p.a, n, p.b, p.b)
		case back != n && p.a < p.b:
			errs.Add(where[p], "GPU %d lists %d links to GPU %d, but GPU %d lists %d back; links are symmetric", p.a, n, p.b, p.b, back)
		}
	}
}

// LoadNodeTopology decodes, validates and defaults a simulated node description.
func LoadNodeTopology(data []byte, name string) (*NodeTopology, error) {
	t := &NodeTopology{}
	src, errs, err := decodeStrict(data, name, t)
	if err != nil {
		return nil, err
	}
	if verr := t.Validate(); verr != nil {
		errs = append(errs, verr.(FieldErrors)...)
	}
	if len(errs) > 0 {
		return nil, src.Annotate(errs)
	}
	t.SetDefaults()
	return t, nil
}
