// Package planview renders a node's inventory and plan for people (a table)
// and for machines (YAML, JSON), as `kyb-dra-plugin plan` prints them.
package planview

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// View is the machine-readable form of a plan.
type View struct {
	Node      string               `json:"node"`
	Source    string               `json:"source"`
	Inventory *inventory.Inventory `json:"inventory"`
	Policy    string               `json:"allocationPolicy"`
	Profiles  []ProfileView        `json:"profiles"`
	// Order is the device order the scheduler tries (first fit).
	Order    []string `json:"order"`
	Warnings []string `json:"warnings,omitempty"`
}

// ProfileView is one profile and its groups.
type ProfileView struct {
	Name               string `json:"name"`
	Resource           string `json:"resource"`
	GPUsPerGroup       int    `json:"gpusPerGroup"`
	SeatsPerGroup      int    `json:"seatsPerGroup"`
	AllowOverprovision bool   `json:"allowOverprovision"`
	Sharing            string `json:"sharing"`
	TimeSlice          string `json:"timeSlice,omitempty"`
	// MPSComputeMode, for mps, is exclusiveProcess or keep.
	MPSComputeMode string `json:"mpsComputeMode,omitempty"`
	// Sized says the profile's claims ask their seats' sizes (its
	// groups' sizes are in the published devices).
	Sized  bool        `json:"sized,omitempty"`
	Seats  int         `json:"seats"`
	Groups []GroupView `json:"groups"`
	// MIG is the MIG profile whose instances are the seats, and MIGGPUs
	// the GPUs they are made on; such a profile has no whole-GPU groups.
	MIG     string   `json:"mig,omitempty"`
	MIGGPUs []MIGGPU `json:"migGPUs,omitempty"`
}

// MIGGPU is one GPU of a MIG profile: its index, its product (whose MIG
// geometry NVML gave) and how many instances it offers.
type MIGGPU struct {
	GPU   int    `json:"gpu"`
	Model string `json:"model"`
	Seats int    `json:"seats"`
}

// GroupView is one group.
type GroupView struct {
	Name         string   `json:"name"`
	Device       string   `json:"device"`
	GPUs         []int    `json:"gpus"`
	Explicit     bool     `json:"explicit"`
	Interconnect string   `json:"interconnect"`
	NVLinks      int      `json:"nvlinks,omitempty"`
	NUMANode     *int     `json:"numaNode,omitempty"`
	PCIeRoot     string   `json:"pcieRoot,omitempty"`
	Seats        []string `json:"seats"`
	// Excludes lists the devices that cannot be in use while this one is.
	Excludes []string `json:"excludes,omitempty"`
}

// NewView builds the machine-readable view.
func NewView(node, source string, inv *inventory.Inventory, plan *planner.Plan) *View {
	v := &View{Node: node, Source: source, Inventory: inv, Policy: string(plan.Policy), Warnings: plan.Warnings}
	all := plan.Groups()
	for _, prof := range plan.Profiles {
		pv := ProfileView{
			Name: prof.Name, Resource: prof.Resource, GPUsPerGroup: prof.Size,
			SeatsPerGroup: prof.SeatsPerGroup, AllowOverprovision: prof.AllowOverprovision,
			Sharing: string(prof.Sharing), TimeSlice: string(prof.TimeSlice),
			Seats: prof.Seats(), Groups: []GroupView{},
		}
		if prof.Sharing == v1alpha1.SharingMPS {
			pv.MPSComputeMode = string(prof.MPSComputeMode)
			pv.Sized = prof.Sizes != nil
		}
		if prof.MIG != nil {
			pv.Sharing, pv.MIG = "mig", prof.MIG.Profile
			for _, g := range prof.MIG.GPUs {
				pv.MIGGPUs = append(pv.MIGGPUs, MIGGPU{GPU: g.Index(), Model: g.Model.Name, Seats: g.Seats})
			}
		}
		for _, g := range prof.Groups {
			gv := GroupView{
				Name: g.Name, Device: g.DeviceName(), GPUs: g.GPUs, Explicit: g.Explicit,
				Interconnect: g.Interconnect.String(), NVLinks: g.Weakest.NVLinks, PCIeRoot: g.PCIeRoot,
			}
			if g.NUMANode >= 0 {
				n := g.NUMANode
				gv.NUMANode = &n
			}
			for s := 0; s < g.Seats(); s++ {
				gv.Seats = append(gv.Seats, g.SeatID(s))
			}
			for _, o := range all {
				if g.Excludes(o) {
					gv.Excludes = append(gv.Excludes, o.DeviceName())
				}
			}
			pv.Groups = append(pv.Groups, gv)
		}
		v.Profiles = append(v.Profiles, pv)
	}
	for _, g := range plan.Ordered() {
		v.Order = append(v.Order, g.DeviceName())
	}
	return v
}

// WriteJSON writes the view as indented JSON.
func WriteJSON(w io.Writer, v *View) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteYAML writes the view as YAML.
func WriteYAML(w io.Writer, v *View) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("render plan as YAML: %w", err)
	}
	_, err = w.Write(b)
	return err
}

// WriteTable writes the inventory, the link matrix, the profiles and the
// groups (in scheduling order) as aligned tables.
func WriteTable(w io.Writer, node, source string, inv *inventory.Inventory, plan *planner.Plan) error {
	out := &errWriter{w: w}
	fmt.Fprintf(out, "Node %s: %s, CUDA %s (%s)\n\n", node, inv.Summary(), inv.CUDADriverVersion, source)

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tUUID\tBUS ID\tNUMA\tPCIE ROOT\tMEMORY\tARCH\tCC")
	for _, g := range inv.GPUs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d MiB\t%s\t%s\n", g.Index, g.UUID, g.PCIBusID, numa(g.NUMANode), dash(g.PCIeRoot), g.MemoryMiB, g.Architecture, g.CUDAComputeCapability)
	}
	tw.Flush()

	if len(inv.GPUs) > 1 {
		fmt.Fprintln(out, "\nLinks (NV<n>: n NVLinks; PIX: same PCIe switch; PXB: several switches; PHB: same host bridge; NODE: same NUMA node; SYS: across sockets)")
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		header := []string{""}
		for _, g := range inv.GPUs {
			header = append(header, "GPU"+strconv.Itoa(g.Index))
		}
		fmt.Fprintln(tw, strings.Join(header, "\t"))
		for i := range inv.GPUs {
			row := []string{"GPU" + strconv.Itoa(i)}
			for j := range inv.GPUs {
				if i == j {
					row = append(row, "X")
					continue
				}
				row = append(row, LinkLabel(inv.Link(i, j)))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		tw.Flush()
	}

	fmt.Fprintln(out, "\nProfiles")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROFILE\tRESOURCE\tGPUS/GROUP\tSEATS/GROUP\tGROUPS\tSEATS\tOVERPROVISION\tSHARING")
	for _, p := range plan.Profiles {
		sharing := string(p.Sharing)
		if p.TimeSlice != "" {
			sharing += " (" + string(p.TimeSlice) + ")"
		}
		if p.Sizes != nil {
			sharing += " (sized)"
		}
		if p.Sharing == v1alpha1.SharingMPS && p.MPSComputeMode == v1alpha1.MPSComputeModeKeep {
			sharing += " (compute mode kept)"
		}
		groups := len(p.Groups)
		if p.MIG != nil {
			// Its groups are the GPUs its instances are made on.
			groups, sharing = len(p.MIG.GPUs), "mig "+p.MIG.Profile+" (GPUs "+migGPUs(p.MIG)+")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.Resource, p.Size, p.SeatsPerGroup, groups, p.Seats(), yesNo(p.AllowOverprovision), sharing)
	}
	tw.Flush()

	fmt.Fprintf(out, "\nGroups, in the order the scheduler tries them (policy %s)\n", plan.Policy)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tGROUP\tGPUS\tINTERCONNECT\tNUMA\tPCIE ROOT\tSEATS\tFROM\tEXCLUDES WHILE IN USE")
	all := plan.Groups()
	for _, g := range plan.Ordered() {
		var excl []string
		for _, o := range all {
			if g.Excludes(o) {
				excl = append(excl, o.DeviceName())
			}
		}
		from := "topology"
		if g.Explicit {
			from = "config"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", g.DeviceName(), g.Name, g.GPUList(), interconnect(g), numa(g.NUMANode), dash(g.PCIeRoot), g.Seats(), from, dash(strings.Join(excl, " ")))
	}
	tw.Flush()
	for _, warn := range plan.Warnings {
		fmt.Fprintf(out, "\nwarning: %s\n", warn)
	}
	for _, warn := range inv.Warnings {
		fmt.Fprintf(out, "\nwarning: %s\n", warn)
	}
	return out.err
}

// LinkLabel names a link as nvidia-smi topo -m does.
func LinkLabel(l inventory.Link) string {
	if l.NVLinks > 0 {
		return "NV" + strconv.Itoa(l.NVLinks)
	}
	switch l.PCIe {
	case inventory.PCIeSameBoard:
		return "BRD"
	case inventory.PCIeSingleSwitch:
		return "PIX"
	case inventory.PCIeMultiSwitch:
		return "PXB"
	case inventory.PCIeHostBridge:
		return "PHB"
	case inventory.PCIeNUMANode:
		return "NODE"
	default:
		return "SYS"
	}
}

func interconnect(g *planner.Group) string {
	switch {
	case len(g.GPUs) == 1:
		return "-"
	case g.Weakest.NVLinks > 0:
		return fmt.Sprintf("nvlink (NV%d)", g.Weakest.NVLinks)
	default:
		return g.Interconnect.String()
	}
}

func numa(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// errWriter remembers the first write error so the renderers can write
// freely and report once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// migGPUs lists a MIG profile's GPU indices.
func migGPUs(m *planner.MIGSeats) string {
	var out []string
	for _, g := range m.GPUs {
		out = append(out, strconv.Itoa(g.Index()))
	}
	return strings.Join(out, ",")
}
