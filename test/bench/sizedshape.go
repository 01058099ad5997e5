package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// Sized seats (README, "Sized seats"): each GPU one shared group of 8
// sized seats, whose claims consume memory and compute beside a seat.
// A full node holds 8 claims of the default size on each group; the
// claim measured against it asks a size, as a sized claim does, or asks
// nothing.

// SizedConfig is the README's sized profile, alone.
const SizedConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  sharing: {strategy: mps, sized: true}
`

// SizedBesideGroupsConfig is the sized profile beside groups of two and
// four GPUs of one seat, which a full node's sized seats block through
// their GPUs' counters.
const SizedBesideGroupsConfig = SizedConfig + `- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-4x-seat}
`

// SizedProbe is the size of the sized claims measured: 10 GiB and 10 %
// of an H100, more than a full node's groups have left.
func SizedProbe() []func(*resourceapi.DeviceRequest) {
	return []func(*resourceapi.DeviceRequest){
		schedulertest.WithCapacity(string(draresources.MemoryCapacity), "10Gi"),
		schedulertest.WithCapacity(string(draresources.ComputeCapacity), "10"),
	}
}

// SizedShapes are our node (preset) with sized seats, alone and beside
// larger groups, each measured with claims asking a size and, alone,
// with claims asking nothing (the default size).
func SizedShapes(ctx context.Context, preset string) ([]Shape, error) {
	var out []Shape
	for _, s := range []struct {
		name, config string
		probe        []func(*resourceapi.DeviceRequest)
	}{
		{"sized seats, claims ask 10Gi and 10 %", SizedConfig, SizedProbe()},
		{"sized seats, claims ask nothing (the default size)", SizedConfig, nil},
		{"sized seats beside 2x and 4x groups, claims ask 10Gi and 10 %", SizedBesideGroupsConfig, SizedProbe()},
	} {
		shape, err := KybShape(ctx, "ours: "+s.name, preset, s.config, "1x-sized")
		if err != nil {
			return nil, err
		}
		shape.Probe = s.probe
		out = append(out, shape)
	}
	return out, nil
}

// The sized seats study: rejecting a full node of sized seats at the
// allocator, beside upstream's basic shape and our default one, under
// the stock allocator (this binary) and the patched one (the same
// measurement in kyb-bench built against test/allocpatch, as a child
// process), ratios taken within each process.

// SizedRejectGoal is the most a full node of sized seats may cost to
// reject, as a ratio to basic's.
const SizedRejectGoal = 1.5

// sizedStudyShapes are basic, our default shape, then the sized shapes.
func sizedStudyShapes(ctx context.Context, preset string) ([]Shape, error) {
	def, err := KybShape(ctx, "ours: default, every group published", preset, "", "1x")
	if err != nil {
		return nil, err
	}
	sized, err := SizedShapes(ctx, preset)
	if err != nil {
		return nil, err
	}
	return append([]Shape{BasicShape(), def}, sized...), nil
}

// MeasureSizedFigures measures the reject of every shape of the study
// once in this process.
func MeasureSizedFigures(ctx context.Context, opts PatchOptions) (AllocFigures, error) {
	shapes, err := sizedStudyShapes(ctx, opts.Preset)
	if err != nil {
		return AllocFigures{}, err
	}
	out := AllocFigures{Allocator: AllocatorModule()}
	for _, s := range shapes {
		rej, err := RejectFull(ctx, s, opts.Nodes, 3)
		if err != nil {
			return out, err
		}
		out.Shapes = append(out.Shapes, ShapeFigures{Name: s.Name, Reject: rej, PerNode: s.PerNode})
	}
	return out, nil
}

// SizedStudy is the study's rounds.
type SizedStudy struct {
	Options        PatchOptions
	Stock, Patched []AllocFigures
}

// RunSized runs rounds of the study, stock then patched.
func RunSized(ctx context.Context, opts PatchOptions, rounds int) (*SizedStudy, error) {
	if opts.Patched == "" {
		return nil, fmt.Errorf("no patched kyb-bench given (-patched; hack/allocator-patch.sh builds it)")
	}
	st := &SizedStudy{Options: opts}
	for range rounds {
		stock, err := MeasureSizedFigures(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("stock allocator: %w", err)
		}
		raw, err := runPatched(ctx, opts, "sized-figures")
		if err != nil {
			return nil, err
		}
		var patched AllocFigures
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

// Table is the stock/patched/basic table of the sized shapes.
func (st *SizedStudy) Table() *Table {
	t := &Table{
		Title:  fmt.Sprintf("Sized seats: rejecting a full node, stock vs patched vs basic, %d nodes (median of %d rounds)", st.Options.Nodes, len(st.Stock)),
		Header: []string{"shape", "claims/node", "reject a full node: stock", "patched", "ratio to basic: stock", "patched", "goal ≤ 1.5x: stock", "patched"},
	}
	for i, s := range st.Stock[0].Shapes {
		var rs, rp, rrs, rrp []float64
		for r := range st.Stock {
			so, pa := st.Stock[r], st.Patched[r]
			rs, rp = append(rs, float64(so.Shapes[i].Reject)), append(rp, float64(pa.Shapes[i].Reject))
			rrs, rrp = append(rrs, float64(so.Shapes[i].Reject)/float64(so.Shapes[0].Reject)), append(rrp, float64(pa.Shapes[i].Reject)/float64(pa.Shapes[0].Reject))
		}
		row := []string{s.Name, fmt.Sprint(s.PerNode), Dur(time.Duration(Median(rs))), Dur(time.Duration(Median(rp))), Ratio(Median(rrs)), Ratio(Median(rrp)), "", ""}
		if strings.Contains(s.Name, "sized") {
			row[6], row[7] = Verdict(Median(rrs) <= SizedRejectGoal), Verdict(Median(rrp) <= SizedRejectGoal)
		}
		t.Rows = append(t.Rows, row)
	}
	t.Notes = []string{
		fmt.Sprintf("Stock: %s. Patched: %s.", st.Stock[0].Allocator, st.Patched[0].Allocator),
		fmt.Sprintf("Reject: a one-device claim against %d full nodes, each once per allocator, as kube-scheduler's Filter does for a pod; ratios are to basic measured in the same process. "+
			"A full node of sized seats holds 8 claims of the default size on each of its 8 groups; the claim rejected asks 10Gi and 10 %% where the shape says so, else nothing.", st.Options.Nodes),
	}
	return t
}
