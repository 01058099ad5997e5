package draresources_test

import (
	"slices"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// TestWithdrawMIGOfGPUsNotInMIGMode: the MIG devices of the GPUs named,
// and only those, are not published; their whole-GPU groups are.
func TestWithdrawMIGOfGPUsNotInMIGMode(t *testing.T) {
	const config = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0, 1]}
- {resource: kyb.ai/mig-2g.20gb, mig: {profile: 2g.20gb}, gpus: [0]}
`
	for _, tc := range []struct {
		name string
		gpus []int
		want []string
	}{
		{name: "none", gpus: nil, want: nil},
		{name: "GPU 0", gpus: []int{0}, want: []string{
			"g0-mig-1g-10gb-0", "g0-mig-1g-10gb-1", "g0-mig-1g-10gb-2", "g0-mig-1g-10gb-3", "g0-mig-1g-10gb-4", "g0-mig-1g-10gb-5", "g0-mig-1g-10gb-6",
			"g0-mig-2g-20gb-0", "g0-mig-2g-20gb-2", "g0-mig-2g-20gb-4",
		}},
		{name: "GPU 1", gpus: []int{1}, want: []string{
			"g1-mig-1g-10gb-0", "g1-mig-1g-10gb-1", "g1-mig-1g-10gb-2", "g1-mig-1g-10gb-3", "g1-mig-1g-10gb-4", "g1-mig-1g-10gb-5", "g1-mig-1g-10gb-6",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sn := simnodetest.New(t, "dgx-h100", config)
			res := draresources.Resources(sn.Plan, sn.Inv, "node-1", draresources.LayoutShared)
			before := deviceNames(res)
			n := draresources.WithdrawMIGOf(res, sn.Plan, tc.gpus)
			after := deviceNames(res)
			var gone []string
			for _, d := range before {
				if !slices.Contains(after, d) {
					gone = append(gone, d)
				}
			}
			slices.Sort(gone)
			if !slices.Equal(gone, tc.want) || n != len(tc.want) {
				t.Errorf("withdrawn %v (counted %d), want %v", gone, n, tc.want)
			}
			for _, d := range []string{"g0-1x", "g1-1x", "g01-2x"} {
				if !slices.Contains(after, d) {
					t.Errorf("whole-GPU group %s withdrawn; want it published", d)
				}
			}
		})
	}
}
