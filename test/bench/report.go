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
	// Three significant digits; the unit is chosen after rounding, so that
	// 999.7 µs reads 1 ms and not 1e+03 µs.
	switch {
	case d >= 999500*time.Microsecond:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 999500*time.Nanosecond:
		return sig3(float64(d)/float64(time.Millisecond)) + " ms"
	default:
		return sig3(float64(d)/float64(time.Microsecond)) + " µs"
	}
}

// sig3 formats x (below 1000) with three significant digits, without an
// exponent.
func sig3(x float64) string {
	switch {
	case x >= 99.95:
		return fmt.Sprintf("%.0f", x)
	case x >= 9.995:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
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
