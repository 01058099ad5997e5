package bench

import (
	"slices"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

// TestSizedShapesRejectAFullNode checks the sized shapes before the
// allocator studies time them: a node takes 8 default-size claims on
// each of its 8 sized groups and then refuses the next, sized or not; the
// full nodes are rejected, and a sized claim is placed by first fit.
func TestSizedShapesRejectAFullNode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	shapes, err := SizedShapes(ctx, "dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shapes {
		t.Run(s.Name, func(t *testing.T) {
			if s.Class != "gpu-1x-sized.kyb.ai" || s.PerNode != 64 {
				t.Fatalf("class %s with %d a node, want gpu-1x-sized.kyb.ai with 64", s.Class, s.PerNode)
			}
			// RejectFull fails where a node takes more or fewer than 64,
			// or where the claim measured fits a full node.
			if _, err := RejectFull(ctx, s, 2, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := FirstFit(ctx, s, 2, 10); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The table judges the sized shapes alone, each by the median over
// rounds of its ratio to basic in the same process.
func TestSizedStudyTableJudgesTheSizedShapes(t *testing.T) {
	figures := func(basic, def, sized time.Duration) AllocFigures {
		return AllocFigures{Shapes: []ShapeFigures{
			{Name: "basic (upstream scheduler_perf)", Reject: basic},
			{Name: "ours: default, every group published", Reject: def},
			{Name: "ours: sized seats, claims ask 10Gi and 10 %", Reject: sized},
		}}
	}
	st := &SizedStudy{
		// Stock: 2x, 1.4x and 1.2x basic; patched: 1.6x, 1.6x, 1x.
		Stock:   []AllocFigures{figures(10*time.Microsecond, 50*time.Microsecond, 20*time.Microsecond), figures(10*time.Microsecond, 50*time.Microsecond, 14*time.Microsecond), figures(5*time.Microsecond, 50*time.Microsecond, 6*time.Microsecond)},
		Patched: []AllocFigures{figures(5*time.Microsecond, 5*time.Microsecond, 8*time.Microsecond), figures(5*time.Microsecond, 5*time.Microsecond, 8*time.Microsecond), figures(5*time.Microsecond, 5*time.Microsecond, 5*time.Microsecond)},
	}
	rows := st.Table().Rows
	if got := rows[1][6] + rows[1][7]; got != "" {
		t.Errorf("the default shape is judged: %q", got)
	}
	if got, want := rows[2][4:8], []string{"1.40x", "1.60x", "met", "NOT met"}; !slices.Equal(got, want) {
		t.Errorf("sized row %v, want %v", got, want)
	}
}
