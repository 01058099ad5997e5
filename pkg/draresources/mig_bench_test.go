package draresources_test

import (
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// BenchmarkRejectFullNode is what the scheduler's allocator spends to find
// that a one-seat claim does not fit on a node whose seats of its class
// are all held: the common Filter outcome in a busy cluster, per node.
// "groups" is the default configuration full of 1x seats; "mig" is every
// MIG profile of the H100 on every GPU beside 1x…8x, full of 1g.10gb
// seats (56), whose other MIG devices the counters block but the
// allocator still evaluates selectors on.
func BenchmarkRejectFullNode(b *testing.B) {
	model := presetModel(b, "dgx-h100")
	for _, bc := range []struct {
		name, config, class string
		seats               int
	}{
		{"groups", "", class1x, 8},
		{"mig", everyMIGProfile(model), classMIG1g, 56},
	} {
		b.Run(bc.name, func(b *testing.B) {
			n := newNode(b, "dgx-h100", bc.config, draresources.LayoutShared)
			if got := len(n.fill(b, bc.class)); got != bc.seats {
				b.Fatalf("%d seats fit, want %d", got, bc.seats)
			}
			claim := schedulertest.Claim("probe", bc.class, 1)
			b.ResetTimer()
			for b.Loop() {
				a, err := n.cluster.Allocator(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if r, err := n.cluster.Try(ctx, a, claim, "node-1"); err != nil || r != nil {
					b.Fatalf("a claim fit on a full node: %v %v", r, err)
				}
			}
		})
	}
}
