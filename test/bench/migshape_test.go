package bench

import (
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// TestMIGShapesHoldEveryInstance checks the MIG shapes of the allocator
// patch study before it times them: a node takes exactly as many of the
// smallest instance as its GPUs make (seven per GPU), and then refuses
// the next one.
func TestMIGShapesHoldEveryInstance(t *testing.T) {
	for _, tc := range []struct {
		preset  string
		class   string
		perNode int
	}{
		{"dgx-h100", "mig-1g.10gb.kyb.ai", 56},
		{"dgx-a100", "mig-1g.5gb.kyb.ai", 56},
		{"dgx-h200", "mig-1g.18gb.kyb.ai", 56},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			s, err := MIGShape(ctx, "mig "+tc.preset, tc.preset)
			if err != nil {
				t.Fatal(err)
			}
			if s.Class != tc.class || s.PerNode != tc.perNode {
				t.Fatalf("class %s with %d a node, want %s with %d", s.Class, s.PerNode, tc.class, tc.perNode)
			}
			if _, err := RejectFull(ctx, s, 2, 1); err != nil {
				t.Fatal(err)
			}
		})
	}
}
