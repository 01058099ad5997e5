package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Table is a markdown table.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
	Notes  []string
}

// Write prints the table as markdown.
func (t *Table) Write(w io.Writer) {
	if t.Title != "" {
		fmt.Fprintf(w, "\n### %s\n\n", t.Title)
	}
	fmt.Fprintf(w, "| %s |\n", strings.Join(t.Header, " | "))
	seps := make([]string, len(t.Header))
	for i := range seps {
		seps[i] = "---"
	}
	fmt.Fprintf(w, "| %s |\n", strings.Join(seps, " | "))
	for _, r := range t.Rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	for _, n := range t.Notes {
		fmt.Fprintf(w, "\n%s\n", n)
	}
}

// Dur formats a duration with three significant digits.
func Dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.3g ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.3g µs", float64(d)/float64(time.Microsecond))
	}
}

// Ratio formats a ratio.
func Ratio(x float64) string { return fmt.Sprintf("%.2fx", x) }

// Verdict says whether a goal holds.
func Verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
