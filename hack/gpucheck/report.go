//go:build gpucheck

package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

// excerptLines is how much of a step's output the report quotes; the
// whole of it is in the step's log beside the report.
const excerptLines = 40

// stepResult is one step as the report tells it.
type stepResult struct {
	id, title string
	took      time.Duration
	outcome
	err error
	// skipped says why the step did not run.
	skipped string
	// log is the file holding the step's whole output, "" for none.
	log string
}

func (r stepResult) status() string {
	switch {
	case r.skipped != "":
		return "skipped"
	case r.err != nil:
		return "FAIL"
	}
	return "ok"
}

// report is gpu-check's report.
type report struct {
	// simulated: the steps met the simulated node's stand-ins, not the
	// hardware.
	simulated bool
	header    []string
	steps     []stepResult
	table     []string
}

func newReport(o options, node *nodesetup.Node) *report {
	host, _ := os.Hostname()
	r := &report{header: []string{
		fmt.Sprintf("%s, on host `%s` as node `%s`", time.Now().UTC().Format(time.RFC3339), host, o.node.NodeName),
		fmt.Sprintf("%s (%s)", node.Inv.Summary(), node.Host.Description),
	}}
	r.simulated = o.node.Simulate != ""
	if r.simulated {
		r.header = append(r.header, "**A simulated node** (`--simulate "+o.node.Simulate+"`, driver root `"+o.node.DriverRoot+"`): this run checked no hardware.")
	}
	if os.Geteuid() != 0 {
		r.header = append(r.header, "Not run as root: steps 3 to 5, 7 and 8 need mount and PID namespaces.")
	}
	return r
}

// add records a step; its whole output goes to a log in dir.
func (r *report) add(dir string, s stepResult) {
	if s.output != "" {
		s.log = filepath.Join(dir, "step-"+s.id+".log")
		if err := os.WriteFile(s.log, []byte(s.output), 0o644); err != nil {
			s.log = ""
		}
	}
	r.steps = append(r.steps, s)
}

// settings records the GPUs' settings before and after.
func (r *report) settings(before, after []gpuSettings) {
	r.table = []string{"| GPU | UUID | compute mode | MIG mode | persistence mode |", "|---|---|---|---|---|"}
	for i, b := range before {
		a := gpuSettings{computeMode: "-", migMode: "-", persistence: "-"}
		if i < len(after) {
			a = after[i]
		}
		r.table = append(r.table, fmt.Sprintf("| %d | %s | %s | %s | %s |", b.index, b.uuid,
			arrow(b.computeMode, a.computeMode), arrow(b.migMode, a.migMode), arrow(b.persistence, a.persistence)))
	}
}

func arrow(before, after string) string {
	if before == after {
		return before + " → " + after
	}
	return "**" + before + " → " + after + "**"
}

func (r *report) failed() bool {
	for _, s := range r.steps {
		if s.err != nil {
			return true
		}
	}
	return false
}

// seatKinds are the kinds of seats gpu-check prepares, by the steps that
// check them.
var seatKinds = []struct {
	name  string
	steps []string
}{
	{"whole GPU", []string{"4", "5", "6"}},
	{"MPS, the GPU's compute mode kept", []string{"7", "8"}},
	{"MIG, read and planned only, its mode left as it is", []string{"11", "12"}},
}

// seatKindsLine says which seat kinds were checked, and how they fared.
func (r *report) seatKindsLine() string {
	var parts []string
	for _, k := range seatKinds {
		status := "ok"
		for _, s := range r.steps {
			if !slices.Contains(k.steps, s.id) {
				continue
			}
			switch {
			case s.err != nil:
				status = "FAIL"
			case s.skipped != "" && status == "ok":
				status = "not all checked"
			}
		}
		parts = append(parts, fmt.Sprintf("%s (steps %s): %s", k.name, strings.Join(k.steps, ", "), status))
	}
	return "Seat kinds prepared and probed: " + strings.Join(parts, "; ") + "."
}

func (r *report) verdict() string {
	var failed []string
	for _, s := range r.steps {
		if s.err != nil {
			failed = append(failed, s.id)
		}
	}
	if len(failed) > 0 {
		return fmt.Sprintf("**FAIL**: step %s failed", strings.Join(failed, ", "))
	}
	return fmt.Sprintf("**pass**: %d steps", len(r.steps))
}

// summary prints a line per step.
func (r *report) summary(w io.Writer) {
	for _, s := range r.steps {
		fmt.Fprintf(w, "gpu-check: %s %-7s %s\n", s.id, s.status(), s.title)
	}
}

func (r *report) write(path string) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# gpu-check\n\n")
	for _, h := range r.header {
		fmt.Fprintf(&b, "%s\n\n", h)
	}
	fmt.Fprintf(&b, "Result: %s\n\n%s\n\n", r.verdict(), r.seatKindsLine())
	fmt.Fprintf(&b, "| # | step | outcome | time |\n|---|---|---|---|\n")
	for _, s := range r.steps {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", s.id, s.title, s.status(), s.took.Round(time.Millisecond))
	}
	if len(r.table) > 0 {
		fmt.Fprintf(&b, "\n## The GPUs' settings, before → after\n\n%s\n", strings.Join(r.table, "\n"))
	}
	for _, s := range r.steps {
		fmt.Fprintf(&b, "\n## %s. %s\n\n", s.id, s.title)
		switch {
		case s.skipped != "":
			fmt.Fprintf(&b, "**skipped**: %s.\n", s.skipped)
			continue
		case s.err != nil:
			fmt.Fprintf(&b, "**FAIL** in %s: %s\n", s.took.Round(time.Millisecond), oneLine(s.err.Error()))
			if s.summary != "" {
				fmt.Fprintf(&b, "\n%s\n", s.summary)
			}
		default:
			fmt.Fprintf(&b, "**ok** in %s: %s\n", s.took.Round(time.Millisecond), s.summary)
		}
		switch {
		case s.hardware != "" && r.simulated:
			fmt.Fprintf(&b, "\nWhat meets the hardware (here the simulated node's stand-ins): %s.\n", s.hardware)
		case s.hardware != "":
			fmt.Fprintf(&b, "\nRan on the hardware: %s.\n", s.hardware)
		}
		for _, u := range s.unchecked {
			fmt.Fprintf(&b, "\nNot checked here: %s.\n", u)
		}
		if s.command != "" {
			fmt.Fprintf(&b, "\n`%s`\n", s.command)
		}
		if len(s.details) > 0 {
			fmt.Fprintf(&b, "\n```\n%s\n```\n", strings.Join(s.details, "\n"))
		}
		switch {
		case s.output != "" && !s.logOnly:
			fmt.Fprintf(&b, "\nOutput%s:\n\n```\n%s\n```\n", excerptNote(s), excerpt(s.output))
		case s.log != "":
			fmt.Fprintf(&b, "\nOutput in %s.\n", filepath.Base(s.log))
		}
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func excerpt(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) > excerptLines {
		lines = append(lines[:excerptLines], "…")
	}
	return strings.Join(lines, "\n")
}

func excerptNote(s stepResult) string {
	n := len(strings.Split(strings.TrimRight(s.output, "\n"), "\n"))
	if n <= excerptLines || s.log == "" {
		return ""
	}
	return fmt.Sprintf(" (the first %d of %d lines; all in %s)", excerptLines, n, filepath.Base(s.log))
}
