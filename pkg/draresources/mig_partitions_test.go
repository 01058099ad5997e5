package draresources_test

import (
	"slices"
	"testing"

	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

const migTwoProfilesOnGPU0 = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-8x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}
- {resource: kyb.ai/mig-2g.20gb, mig: {profile: 2g.20gb}, gpus: [0]}
`

// TestPartitionsWithdrawWhatTheyMakeImpossible: on GPU 0, a static
// 1g.10gb seat at slice 0 and a foreign instance at slice 1. What they
// overlap and GPU 0's whole-GPU groups are not published, the static
// seat's device is, marked, and the scheduler's allocator hands out
// exactly the rest.
func TestPartitionsWithdrawWhatTheyMakeImpossible(t *testing.T) {
	sn := simnodetest.New(t, "dgx-h100", migTwoProfilesOnGPU0)
	res := draresources.Resources(sn.Plan, sn.Inv, "node-1", draresources.LayoutShared)
	before := deviceNames(res)
	parts := []draresources.MIGPartition{
		{GPU: 0, Placement: mig.Placement{Start: 0, Size: 1}, Seat: "g0-mig-1g-10gb-0"},
		{GPU: 0, Placement: mig.Placement{Start: 1, Size: 1}},
	}
	n := draresources.WithdrawAroundPartitions(res, sn.Plan, parts)
	after := deviceNames(res)
	var gone []string
	for _, d := range before {
		if !slices.Contains(after, d) {
			gone = append(gone, d)
		}
	}
	slices.Sort(gone)
	want := []string{"g0-1x", "g0-mig-1g-10gb-1", "g0-mig-2g-20gb-0", "g01-2x", "g01234567-8x"}
	if !slices.Equal(gone, want) || n != len(want) {
		t.Errorf("withdrawn %v (counted %d), want %v", gone, n, want)
	}
	var static []string
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			if a, ok := d.Attributes[draresources.AttrStatic]; ok && a.BoolValue != nil && *a.BoolValue {
				static = append(static, d.Name)
			}
		}
	}
	if !slices.Equal(static, []string{"g0-mig-1g-10gb-0"}) {
		t.Errorf("static devices %v, want g0-mig-1g-10gb-0", static)
	}

	c := schedulertest.New(schedulertest.SchedulerFeatures())
	c.AddNode("node-1", res, driver.Name)
	c.AddClasses(draresources.DeviceClasses(sn.Plan.Profiles, draresources.DeviceClassOptions{})...)
	n1 := &node{inv: sn.Inv, plan: sn.Plan, cluster: c}
	// A claim that wants a static seat selects it as the design says.
	onlyStatic := schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].?static.orValue(false)`)
	if r := n1.allocate(t, "static", classMIG1g, onlyStatic); r == nil || r.Devices.Results[0].Device != "g0-mig-1g-10gb-0" {
		t.Fatalf("a claim selecting a static seat got %+v, want g0-mig-1g-10gb-0", r)
	}
	if r := n1.allocate(t, "static-2", classMIG1g, onlyStatic); r != nil {
		t.Fatalf("a second claim selecting a static seat got %+v, want none: there is one", r)
	}
	if got, want := n1.fill(t, classMIG2g), []string{"g0-mig-2g-20gb-4", "g0-mig-2g-20gb-2"}; !slices.Equal(got, want) {
		t.Errorf("2g.20gb seats %v, want %v", got, want)
	}
	if got, want := n1.fill(t, classMIG1g), []string{"g0-mig-1g-10gb-6"}; !slices.Equal(got, want) {
		t.Errorf("1g.10gb seats beside them %v, want %v (slices 2-5 held, 1 foreign, 0 the static seat held)", got, want)
	}
	if got := n1.fill(t, class1x); slices.Contains(got, "g0-1x") || len(got) == 0 {
		t.Errorf("1x seats %v, want those of every GPU but GPU 0", got)
	}
}

func deviceNames(res resourceslice.DriverResources) []string {
	var out []string
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			out = append(out, d.Name)
		}
	}
	return out
}

// TestPartitionsWithdrawPerSeatGroups: in the per-seat layout (no MIG
// devices) every seat of a group with a partitioned GPU is withdrawn.
func TestPartitionsWithdrawPerSeatGroups(t *testing.T) {
	sn := simnodetest.New(t, "dgx-h100", migTwoProfilesOnGPU0)
	res := draresources.Resources(sn.Plan, sn.Inv, "node-1", draresources.LayoutPerSeat)
	before := deviceNames(res)
	n := draresources.WithdrawAroundPartitions(res, sn.Plan, []draresources.MIGPartition{{GPU: 0, Placement: mig.Placement{Start: 1, Size: 1}}})
	idx := draresources.Index(sn.Plan)
	var want int
	for _, d := range before {
		if slices.Contains(idx[d].Group.GPUs, 0) {
			want++
			if slices.Contains(deviceNames(res), d) {
				t.Errorf("seat %s of a group with GPU 0 is published", d)
			}
		} else if !slices.Contains(deviceNames(res), d) {
			t.Errorf("seat %s of a group without GPU 0 is withdrawn", d)
		}
	}
	if want == 0 || n != want {
		t.Errorf("withdrew %d seats, want %d (and some)", n, want)
	}
}
