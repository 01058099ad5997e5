package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable prints the report for a person: one line per check, its
// details and what to do indented below it, and the counts.
func WriteTable(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "CHECK\tSTATUS\tRESULT\n")
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Status, c.Summary)
		for _, d := range c.Details {
			fmt.Fprintf(tw, "\t\t  %s\n", d)
		}
		if c.Fix != "" && c.Status != OK {
			fmt.Fprintf(tw, "\t\t  fix: %s\n", c.Fix)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nnode %s: %d ok, %d warn, %d fail\n", r.Node, r.Counts[OK], r.Counts[Warn], r.Counts[Fail])
	return err
}

// WriteJSON prints the report as JSON, a contract for scripts: the field
// names of Report and Check.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
