package seatview

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kyb-ai/kyb-dra-driver/pkg/fragmentation"
)

// WriteJSON prints the view as its JSON contract.
func WriteJSON(w io.Writer, v *View) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteTable prints the view for a person: per node a line per group, its
// holders beside it, then the free seats per profile, then each node's
// fragmentation and the nodes' together. wide adds the
// interconnect, the taints and the seats' generations. Where a node
// publishes MIG devices, a MIG column gives each one's MIG profile and
// placement, and a held seat its MIG device's UUID ("-" until the plugin
// has written the claim's status). Where a node publishes sized groups,
// MEMORY and COMPUTE give each one's held and published memory (per GPU)
// and compute, a held seat its size, and a table after the free seats
// what is free per sized profile. Every cell is escaped (see cell): text
// from the API cannot add rows or columns.
func WriteTable(w io.Writer, v *View, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	withMIG, withSizes := false, false
	for _, n := range v.Nodes {
		for _, g := range n.Groups {
			withMIG = withMIG || g.MIG != nil
			withSizes = withSizes || g.Sizes != nil
		}
	}
	for i, n := range v.Nodes {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		row(tw, "NODE "+n.Name)
		for _, p := range n.IncompletePools {
			row(tw, fmt.Sprintf("NOTE: pool %s is incomplete (being published): %d of the %d ResourceSlices of its generation %d are listed; "+
				"the scheduler allocates none of its devices until all are, so its groups are not shown", p.Pool, p.Slices, p.ResourceSliceCount, p.Generation))
		}
		if len(n.Groups) == 0 && len(n.IncompletePools) > 0 {
			continue
		}
		header := []string{"DEVICE", "GROUP", "PROFILE"}
		if withMIG {
			header = append(header, "MIG")
		}
		header = append(header, "GPUS")
		if wide {
			header = append(header, "INTERCONNECT")
		}
		header = append(header, "SEATS", "HELD")
		if withSizes {
			header = append(header, "MEMORY", "COMPUTE")
		}
		header = append(header, "STATE")
		if wide {
			header = append(header, "TAINTS")
		}
		fmt.Fprintln(tw, strings.Join(append(header, "HELD BY"), "\t"))
		for _, g := range n.Groups {
			cells := []string{g.Device, g.Group, g.Profile}
			if withMIG {
				cells = append(cells, migCell(g.MIG))
			}
			cells = append(cells, ints(g.GPUs))
			if wide {
				cells = append(cells, dash(g.Interconnect))
			}
			cells = append(cells, strconv.Itoa(g.Seats), strconv.Itoa(g.HeldSeats))
			if withSizes {
				cells = append(cells, memoryCell(g.Sizes), computeCell(g.Sizes))
			}
			cells = append(cells, state(g))
			if wide {
				cells = append(cells, dash(strings.Join(g.Taints, ",")))
			}
			cells = append(cells, dash(heldBy(g, wide)))
			row(tw, cells...)
		}
	}
	if len(v.Nodes) == 0 {
		fmt.Fprintln(tw, "No node publishes gpu.kyb.ai devices.")
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "FREE SEATS\tFREE\tTOTAL")
	for _, p := range v.Free {
		row(tw, p.Profile, strconv.Itoa(p.Free), strconv.Itoa(p.Total))
	}
	if len(v.Sizes) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "FREE SIZES\tMEMORY FREE\tMOST ON ONE GROUP\tMEMORY\tCOMPUTE FREE\tMOST ON ONE GROUP\tCOMPUTE")
		for _, p := range v.Sizes {
			row(tw, p.Profile, quantity(p.FreeMemoryBytes), quantity(p.LargestFreeMemoryBytes), quantity(p.MemoryBytes),
				percent(p.FreeComputePercent), percent(p.LargestFreeComputePercent), percent(p.ComputePercent))
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "FRAGMENTATION\tFREE GPUS\tLARGEST GROUP\tIN FREE LARGEST GROUPS\tFRAGMENTED")
	for _, n := range v.Nodes {
		m := n.Fragmentation
		row(tw, n.Name, strconv.Itoa(m.Free), strconv.Itoa(m.Largest), strconv.Itoa(m.Inside), fragmented(m))
	}
	// Each node's figures are against its own largest group.
	m := v.Fragmentation
	row(tw, "all nodes", strconv.Itoa(m.Free), "-", strconv.Itoa(m.Inside), fragmented(m))
	return tw.Flush()
}

// fragmented renders the fragmented GPUs and their share of the free
// ones: 6 (75 %).
func fragmented(m fragmentation.Measure) string {
	if m.Free == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%.0f %%)", m.Fragmented, 100*m.Share())
}

// row prints one line of cells, each escaped.
func row(w io.Writer, cells ...string) {
	for i := range cells {
		cells[i] = cell(cells[i])
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// cell escapes what is not printable in a table cell as strconv.Quote
// would write it: control characters (a newline or a tab would start a row
// or a column; an escape sequence would drive the terminal), other
// characters that are not graphic (such as U+202E, which turns text
// around, and spaces other than U+0020) and bytes that are not UTF-8 (such
// as tabwriter's escape, 0xff). Anything else, backslashes included, is
// printed as it is, so ordinary names read unchanged; `-o json` gives the
// exact text.
func cell(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case !strconv.IsPrint(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[:size])
		}
		s = s[size:]
	}
	return b.String()
}

func state(g Group) string {
	switch g.State {
	case StateBlocked:
		return "blocked by " + strings.Join(g.BlockedBy, ",")
	case StateUnhealthy:
		return "unhealthy"
	case StateInUse:
		return "in use"
	default:
		return g.State
	}
}

// heldBy renders "0: ns/claim (ns/pod)" per seat.
func heldBy(g Group, wide bool) string {
	var parts []string
	for _, h := range g.Held {
		seat := "?"
		if h.Seat != nil {
			seat = strconv.Itoa(*h.Seat)
			if wide && h.Generation > 0 {
				seat += " gen " + strconv.FormatInt(h.Generation, 10)
			}
		}
		text := seat + ": " + h.Claim
		if len(h.Pods) > 0 {
			text += " (" + strings.Join(h.Pods, " ") + ")"
		}
		if g.MIG != nil {
			text += " " + dash(h.MIGDeviceUUID)
		}
		if h.Size != nil {
			text += " " + quantity(h.Size.MemoryBytes) + " " + percent(h.Size.ComputePercent)
		}
		parts = append(parts, text)
	}
	if hidden := g.HeldSeats - len(g.Held); hidden > 0 && len(parts) < g.HeldSeats {
		parts = append(parts, fmt.Sprintf("%d in other namespaces", hidden))
	}
	return strings.Join(parts, "; ")
}

// migCell renders a MIG device's profile and placement as nvidia-smi
// writes a placement, and whether it is a static seat: 1g.10gb {6}:1
// static.
func migCell(m *MIGInstance) string {
	if m == nil {
		return "-"
	}
	cell := fmt.Sprintf("%s {%d}:%d", m.Profile, m.PlacementStart, m.PlacementSize)
	if m.Static {
		cell += " static"
	}
	return cell
}

// memoryCell renders a sized group's memory held and published, per
// GPU: 76Gi/80Gi.
func memoryCell(s *Sizes) string {
	if s == nil {
		return "-"
	}
	return quantity(s.HeldMemoryBytes) + "/" + quantity(s.MemoryBytes)
}

// computeCell renders a sized group's compute held and published: 65/100 %.
func computeCell(s *Sizes) string {
	if s == nil {
		return "-"
	}
	return strconv.FormatInt(s.HeldComputePercent, 10) + "/" + percent(s.ComputePercent)
}

// quantity renders a size as the API writes a quantity: 20Gi, 143771Mi.
func quantity(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}

func percent(n int64) string {
	return strconv.FormatInt(n, 10) + " %"
}

func ints(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
