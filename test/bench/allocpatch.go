package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"
)

// The allocator patch study: upstream's basic shape and ours with every
// group published (the default configuration, consumable seats, and every
// MIG profile on a DGX H100 and a DGX A100), under the stock allocator
// (this binary) and under the patch of test/allocpatch (the same
// benchmarks built against the patched module by hack/allocator-patch.sh,
// run as a child process). Each process measures basic too, and ratios are
// taken within a process; rounds alternate between the two.

// PatchOptions size the study.
type PatchOptions struct {
	// Patched is kyb-bench built against the patched allocator.
	Patched string
	// Nodes full nodes are rejected, and the first-fit run places
	// FirstFitClaims claims over as many nodes.
	Nodes, FirstFitClaims int
	Preset                string
	// Seed, Streams and Steps size the decision comparison.
	Seed           uint64
	Streams, Steps int
}

// Patch goals, as ratios to basic, for the patched allocator.
const (
	PatchRejectGoal = 1.0
	PatchClaimsGoal = 1.0
)

// ShapeFigures are one shape's figures in one process.
type ShapeFigures struct {
	Name       string
	Reject     time.Duration
	ClaimsPerS float64
	// Calls and PerCall are the first-fit run's Allocate calls and time
	// per call: claims per second also follow how many claims a node
	// holds, since first fit tries every full node before it.
	Calls   int
	PerCall time.Duration
	// PerNode is how many of the claims a node holds.
	PerNode int
}

// AllocFigures are one process's figures, and the allocator module it was
// built with.
type AllocFigures struct {
	Allocator string
	Shapes    []ShapeFigures
}

// AllocatorModule is the dynamic-resource-allocation module this binary
// was built with: a version, or the directory a replace points at.
func AllocatorModule() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, m := range info.Deps {
		if m.Path != "k8s.io/dynamic-resource-allocation" {
			continue
		}
		if m.Replace != nil {
			// A replace by a directory has no version ("(devel)").
			if filepath.IsAbs(m.Replace.Path) || strings.HasPrefix(m.Replace.Path, ".") {
				return "patched copy at " + m.Replace.Path
			}
			return m.Replace.Path + " " + m.Replace.Version
		}
		return m.Path + " " + m.Version
	}
	return "not linked"
}

// Patched reports whether an AllocatorModule is a patched copy.
func Patched(module string) bool { return strings.HasPrefix(module, "patched copy") }

func patchShapes(ctx context.Context, preset string) ([]Shape, error) {
	def, err := KybShape(ctx, "ours: default, every group published", preset, "", "1x")
	if err != nil {
		return nil, err
	}
	demo, err := KybShape(ctx, "ours: consumable seats (demo config), every group published", preset, DemoConfig, "1x")
	if err != nil {
		return nil, err
	}
	shapes := []Shape{BasicShape(), def, demo}
	// MIG shapes are their presets' own: every MIG profile is a property
	// of the GPU model, and the study compares the two models we simulate.
	for _, preset := range []string{"dgx-h100", "dgx-a100"} {
		s, err := MIGShape(ctx, "ours: every MIG profile and 1x/2x/4x/8x ("+preset+"), smallest instances", preset)
		if err != nil {
			return nil, err
		}
		shapes = append(shapes, s)
	}
	return shapes, nil
}

// MeasureAllocFigures measures every shape once in this process.
func MeasureAllocFigures(ctx context.Context, opts PatchOptions) (AllocFigures, error) {
	shapes, err := patchShapes(ctx, opts.Preset)
	if err != nil {
		return AllocFigures{}, err
	}
	out := AllocFigures{Allocator: AllocatorModule()}
	for _, s := range shapes {
		rej, err := RejectFull(ctx, s, opts.Nodes, 3)
		if err != nil {
			return out, err
		}
		ff, err := FirstFit(ctx, s, opts.Nodes, opts.FirstFitClaims)
		if err != nil {
			return out, err
		}
		out.Shapes = append(out.Shapes, ShapeFigures{Name: s.Name, Reject: rej, ClaimsPerS: ff.ClaimsPerSecond(), Calls: ff.Calls, PerCall: ff.PerCall(), PerNode: s.PerNode})
	}
	return out, nil
}

// PatchStudy is the study's rounds.
type PatchStudy struct {
	Options          PatchOptions
	Stock, Patched   []AllocFigures
	Decisions        DecisionStats
	DecisionsCompare string
}

// RunPatch runs the study: the decision comparison first (a patch that
// decides differently is not worth timing), then rounds of figures.
func RunPatch(ctx context.Context, opts PatchOptions, rounds int) (*PatchStudy, error) {
	if opts.Patched == "" {
		return nil, fmt.Errorf("no patched kyb-bench given (-patched; hack/allocator-patch.sh builds it)")
	}
	st := &PatchStudy{Options: opts}
	stats, err := CompareDecisions(ctx, opts)
	if err != nil {
		return nil, err
	}
	st.Decisions = stats
	for range rounds {
		stock, err := MeasureAllocFigures(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("stock allocator: %w", err)
		}
		var patched AllocFigures
		raw, err := runPatched(ctx, opts, "alloc-figures")
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &patched); err != nil {
			return nil, fmt.Errorf("patched kyb-bench's figures: %w", err)
		}
		if !Patched(patched.Allocator) || Patched(stock.Allocator) {
			return nil, fmt.Errorf("allocators: %q in this binary, %q in %s; want the stock module here and a patched copy there", stock.Allocator, patched.Allocator, opts.Patched)
		}
		st.Stock, st.Patched = append(st.Stock, stock), append(st.Patched, patched)
	}
	return st, nil
}

func runPatched(ctx context.Context, opts PatchOptions, study string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, opts.Patched, "-studies", study, "-log", "/dev/null",
		"-patch-nodes", fmt.Sprint(opts.Nodes), "-firstfit-claims", fmt.Sprint(opts.FirstFitClaims), "-preset", opts.Preset,
		"-decisions-seed", fmt.Sprint(opts.Seed), "-decisions-streams", fmt.Sprint(opts.Streams), "-decisions-steps", fmt.Sprint(opts.Steps))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -studies %s: %w: %s", opts.Patched, study, err, stderr.String())
	}
	return out, nil
}

// CompareDecisions runs the decision streams in this process and in the
// patched binary and fails on the first line that differs. It returns the
// patched run's statistics.
func CompareDecisions(ctx context.Context, opts PatchOptions) (DecisionStats, error) {
	var stock bytes.Buffer
	if _, err := Decisions(ctx, &stock, opts.Seed, opts.Streams, opts.Steps); err != nil {
		return DecisionStats{}, err
	}
	raw, err := runPatched(ctx, opts, "decisions")
	if err != nil {
		return DecisionStats{}, err
	}
	lines, stats, err := splitDecisions(raw)
	if err != nil {
		return stats, err
	}
	want := strings.Split(strings.TrimSuffix(stock.String(), "\n"), "\n")
	for i := range max(len(want), len(lines)) {
		w, g := "(none)", "(none)"
		if i < len(want) {
			w = want[i]
		}
		if i < len(lines) {
			g = lines[i]
		}
		if w != g {
			return stats, fmt.Errorf("decision %d differs:\n  stock:   %s\n  patched: %s", i+1, w, g)
		}
	}
	return stats, nil
}

// WriteDecisions is the decisions study: the lines, then the statistics as
// a last line of JSON after "# stats ".
func WriteDecisions(ctx context.Context, w io.Writer, opts PatchOptions) error {
	st, err := Decisions(ctx, w, opts.Seed, opts.Streams, opts.Steps)
	if err != nil {
		return err
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "# stats %s\n", b)
	return err
}

func splitDecisions(raw []byte) ([]string, DecisionStats, error) {
	var lines []string
	var st DecisionStats
	found := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if stats, ok := strings.CutPrefix(sc.Text(), "# stats "); ok {
			if err := json.Unmarshal([]byte(stats), &st); err != nil {
				return nil, st, fmt.Errorf("decision statistics: %w", err)
			}
			found = true
			continue
		}
		lines = append(lines, sc.Text())
	}
	if !found {
		return nil, st, fmt.Errorf("the patched decisions end without statistics")
	}
	return lines, st, sc.Err()
}

// Table is the stock/patched/basic table.
func (st *PatchStudy) Table() *Table {
	t := &Table{
		Title: fmt.Sprintf("Allocator patch (test/allocpatch): stock vs patched vs basic, %d nodes, every group published (median of %d rounds)", st.Options.Nodes, len(st.Stock)),
		Header: []string{"shape", "reject a full node: stock", "patched", "ratio to basic: stock", "patched", "goal ≤ 1.0x",
			"first-fit claims/s: stock", "patched", "ratio to basic: stock", "patched", "goal ≥ 1.0x"},
	}
	for i, s := range st.Stock[0].Shapes {
		var rs, rp, rrs, rrp, cs, cp, crs, crp []float64
		for r := range st.Stock {
			so, pa := st.Stock[r], st.Patched[r]
			rs, rp = append(rs, float64(so.Shapes[i].Reject)), append(rp, float64(pa.Shapes[i].Reject))
			rrs, rrp = append(rrs, float64(so.Shapes[i].Reject)/float64(so.Shapes[0].Reject)), append(rrp, float64(pa.Shapes[i].Reject)/float64(pa.Shapes[0].Reject))
			cs, cp = append(cs, so.Shapes[i].ClaimsPerS), append(cp, pa.Shapes[i].ClaimsPerS)
			crs, crp = append(crs, so.Shapes[i].ClaimsPerS/so.Shapes[0].ClaimsPerS), append(crp, pa.Shapes[i].ClaimsPerS/pa.Shapes[0].ClaimsPerS)
		}
		row := []string{s.Name, Dur(time.Duration(Median(rs))), Dur(time.Duration(Median(rp))), Ratio(Median(rrs)), Ratio(Median(rrp)), "",
			fmt.Sprintf("%.0f", Median(cs)), fmt.Sprintf("%.0f", Median(cp)), Ratio(Median(crs)), Ratio(Median(crp)), ""}
		if i > 0 {
			row[5], row[10] = Verdict(Median(rrp) <= PatchRejectGoal), Verdict(Median(crp) >= PatchClaimsGoal)
		}
		t.Rows = append(t.Rows, row)
	}
	var perCall []string
	for i, s := range st.Patched[0].Shapes {
		var pc, ratio []float64
		for _, pa := range st.Patched {
			pc = append(pc, float64(pa.Shapes[i].PerCall))
			ratio = append(ratio, float64(pa.Shapes[i].PerCall)/float64(pa.Shapes[0].PerCall))
		}
		perCall = append(perCall, fmt.Sprintf("%s %d claims a node, %d calls, %s per call (%s)", s.Name, s.PerNode, s.Calls, Dur(time.Duration(Median(pc))), Ratio(Median(ratio))))
	}
	d := st.Decisions
	t.Notes = []string{
		fmt.Sprintf("Stock: %s. Patched: %s.", st.Stock[0].Allocator, st.Patched[0].Allocator),
		fmt.Sprintf("Reject: a one-device claim against %d full nodes, each once per allocator; first fit: %d one-device claims over %d nodes, an allocator per claim. "+
			"Ratios are to basic measured in the same process.", st.Options.Nodes, st.Options.FirstFitClaims, st.Options.Nodes),
		"First fit, patched, per Allocate call: " + strings.Join(perCall, "; ") + ". Claims per second also follow how many claims a node holds: first fit tries every full node before the one that fits.",
		fmt.Sprintf("Same decisions as stock: %d random pods over %d streams (seed %d): %d placed, %d refused, %d node answers with errors, %d releases; "+
			"every node's answer for every pod identical; the patched allocator skipped %d devices and %d whole pools before their selectors.",
			d.Pods, st.Options.Streams, st.Options.Seed, d.Placed, d.Refused, d.Errors, d.Releases, d.SkippedBeforeSelectors, d.PoolsSkippedBeforeSelectors),
	}
	return t
}
