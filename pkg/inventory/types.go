// Package inventory discovers a node's GPUs and how they are connected,
// through NVML. The same code runs on real hardware and on a simulated node
// (package simnode serves a simulated node through the NVML interface), so
// what is tested without a GPU is what runs with one.
//
// Discovery runs once at start; the result is cached and refreshed only on
// request, because NVML link queries are slow on large nodes and the
// topology does not change while the driver runs. So is each GPU's MIG
// geometry (pkg/mig's Read), which NVML gives with MIG mode on or off.
package inventory

import (
	"fmt"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// GPU is one GPU as NVML reports it.
type GPU struct {
	Index       int    `json:"index"`
	Minor       int    `json:"minor"`
	UUID        string `json:"uuid"`
	PCIBusID    string `json:"pciBusID"`
	NUMANode    int    `json:"numaNode"` // -1 when unknown
	PCIeRoot    string `json:"pcieRoot"` // "" when unknown
	ProductName string `json:"productName"`
	// Architecture in lower case: ampere, hopper, ...
	Architecture string `json:"architecture"`
	// CUDAComputeCapability is "major.minor".
	CUDAComputeCapability string `json:"cudaComputeCapability"`
	MemoryMiB             int64  `json:"memoryMiB"`
	// MIG is the GPU's MIG geometry as NVML gives it (mig.Read), read
	// once here; nil where it has none, and NoMIG then says why.
	MIG *mig.Model `json:"mig,omitempty"`
	// NoMIG says why MIG is nil: the GPU is not MIG-capable, or NVML
	// would not give its geometry (the call that failed and its answer).
	NoMIG string `json:"noMIG,omitempty"`
	// MIGCapable: the GPU has MIG (GetMigMode answers), whether or not
	// its geometry could be read.
	MIGCapable bool `json:"migCapable,omitempty"`
}

// Inventory is a node's GPUs and the links between every pair of them.
type Inventory struct {
	DriverVersion string `json:"driverVersion"`
	// CUDADriverVersion is "major.minor".
	CUDADriverVersion string `json:"cudaDriverVersion"`
	GPUs              []GPU  `json:"gpus"`
	// Links[i][j] is the connection between GPU i and GPU j (symmetric;
	// the diagonal is unused).
	Links [][]Link `json:"links"`
	// Warnings are oddities found while discovering, such as link data
	// that the two GPUs of a pair do not agree on.
	Warnings []string `json:"warnings,omitempty"`
}

// Link is how two GPUs talk to each other.
type Link struct {
	// NVLinks counts the active NVLink connections between the pair,
	// direct or through an NVSwitch fabric (where every pair of GPUs is
	// connected and counts the links they have into the fabric).
	NVLinks int `json:"nvlinks"`
	// PCIe is their closest common ancestor on the PCIe tree.
	PCIe PCIeLevel `json:"pcie"`
}

// PCIeLevel is the closest common ancestor of two GPUs on the PCIe tree,
// from nearest to farthest. It mirrors NVML's GpuTopologyLevel.
type PCIeLevel int

const (
	PCIeSameBoard    PCIeLevel = iota // one board (dual-GPU card)
	PCIeSingleSwitch                  // behind one PCIe switch
	PCIeMultiSwitch                   // behind several switches, no host bridge crossed
	PCIeHostBridge                    // same host bridge (root complex)
	PCIeNUMANode                      // several host bridges of one NUMA node
	PCIeSystem                        // across NUMA nodes (sockets)
)

var pcieLevelNames = []string{"same-board", "pcie-switch", "pcie-multi-switch", "host-bridge", "numa-node", "system"}

func (l PCIeLevel) String() string {
	if l >= 0 && int(l) < len(pcieLevelNames) {
		return pcieLevelNames[l]
	}
	return fmt.Sprintf("PCIeLevel(%d)", int(l))
}

// MarshalText makes levels readable in JSON and YAML output.
func (l PCIeLevel) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (l *PCIeLevel) UnmarshalText(b []byte) error {
	for i, n := range pcieLevelNames {
		if n == string(b) {
			*l = PCIeLevel(i)
			return nil
		}
	}
	return fmt.Errorf("unknown PCIe level %q", b)
}

// Class is the interconnect class of a link or of a group: the coarse
// ranking the planner groups by, from best to worst.
type Class int

const (
	ClassNVLink Class = iota
	ClassPCIeSwitch
	ClassHostBridge
	ClassNUMANode
	ClassSystem
	// ClassNone is the class of a group with one GPU: no link at all.
	ClassNone
)

var classNames = []string{"nvlink", "pcie-switch", "host-bridge", "numa-node", "system", "none"}

func (c Class) String() string {
	if c >= 0 && int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// MarshalText makes classes readable in JSON and YAML output.
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Class ranks a link: NVLink beats every PCIe path.
func (l Link) Class() Class {
	if l.NVLinks > 0 {
		return ClassNVLink
	}
	switch l.PCIe {
	case PCIeSameBoard, PCIeSingleSwitch, PCIeMultiSwitch:
		return ClassPCIeSwitch
	case PCIeHostBridge:
		return ClassHostBridge
	case PCIeNUMANode:
		return ClassNUMANode
	default:
		return ClassSystem
	}
}

// Better reports whether link a is strictly better than link b: the class
// first, then the number of NVLinks, then the PCIe distance (which breaks
// ties on NVSwitch systems, where every pair has the same NVLinks).
func Better(a, b Link) bool {
	if a.Class() != b.Class() {
		return a.Class() < b.Class()
	}
	if a.NVLinks != b.NVLinks {
		return a.NVLinks > b.NVLinks
	}
	return a.PCIe < b.PCIe
}

// Score is a pair's weight in the sum that breaks ties between groupings of
// equal weakest links. It follows the weights GPU allocators have long used
// (NVLink links dominate, then PCIe distance), so that placements agree
// with what users of those allocators expect.
func (l Link) Score() int {
	s := 0
	switch l.PCIe {
	case PCIeSameBoard:
		s = 60
	case PCIeSingleSwitch:
		s = 50
	case PCIeMultiSwitch:
		s = 40
	case PCIeHostBridge:
		s = 30
	case PCIeNUMANode:
		s = 20
	default:
		s = 10
	}
	return s + 100*l.NVLinks
}

// Link returns the link between GPUs i and j.
func (inv *Inventory) Link(i, j int) Link { return inv.Links[i][j] }

// GPUByIndex returns the GPU with NVML index i.
func (inv *Inventory) GPUByIndex(i int) (*GPU, bool) {
	if i < 0 || i >= len(inv.GPUs) {
		return nil, false
	}
	return &inv.GPUs[i], true
}

// Summary is a one-line description for logs: "8x NVIDIA H100 80GB HBM3, driver 580.95.05".
func (inv *Inventory) Summary() string {
	counts := map[string]int{}
	var order []string
	for _, g := range inv.GPUs {
		if counts[g.ProductName] == 0 {
			order = append(order, g.ProductName)
		}
		counts[g.ProductName]++
	}
	parts := make([]string, len(order))
	for i, p := range order {
		parts[i] = fmt.Sprintf("%dx %s", counts[p], p)
	}
	if len(parts) == 0 {
		parts = []string{"no GPUs"}
	}
	return strings.Join(parts, ", ") + ", driver " + inv.DriverVersion
}
