package seatview

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteJSON prints the view as its JSON contract.
func WriteJSON(w io.Writer, v *View) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteTable prints the view for a person: per node a line per group, its
// holders beside it, then the free seats per profile. wide adds the
// interconnect, the taints and the seats' generations.
func WriteTable(w io.Writer, v *View, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, n := range v.Nodes {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "NODE %s\n", n.Name)
		header := "DEVICE\tGROUP\tPROFILE\tGPUS\tSEATS\tHELD\tSTATE\tHELD BY"
		if wide {
			header = "DEVICE\tGROUP\tPROFILE\tGPUS\tINTERCONNECT\tSEATS\tHELD\tSTATE\tTAINTS\tHELD BY"
		}
		fmt.Fprintln(tw, header)
		for _, g := range n.Groups {
			cells := []string{g.Device, g.Group, g.Profile, ints(g.GPUs)}
			if wide {
				cells = append(cells, dash(g.Interconnect))
			}
			cells = append(cells, strconv.Itoa(g.Seats), strconv.Itoa(g.HeldSeats), state(g))
			if wide {
				cells = append(cells, dash(strings.Join(g.Taints, ",")))
			}
			cells = append(cells, dash(heldBy(g, wide)))
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
	}
	if len(v.Nodes) == 0 {
		fmt.Fprintln(tw, "No node publishes gpu.kyb.ai devices.")
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "FREE SEATS\tFREE\tTOTAL")
	for _, p := range v.Free {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", p.Profile, p.Free, p.Total)
	}
	return tw.Flush()
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
		parts = append(parts, text)
	}
	if hidden := g.HeldSeats - len(g.Held); hidden > 0 && len(parts) < g.HeldSeats {
		parts = append(parts, fmt.Sprintf("%d in other namespaces", hidden))
	}
	return strings.Join(parts, "; ")
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
