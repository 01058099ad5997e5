package draresources_test

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// What the scheduler's own allocator does with the devices of a sized
// profile, as docs/design.md ("Sized seats") says it does.

const (
	classSized   = "gpu-1x-sized.kyb.ai"
	classSized2x = "gpu-2x-sized.kyb.ai"
	// An H200 has 143771 MiB: 140.4 GiB.
	sizedConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  gpus: [0]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 4
  gpus: [2, 3]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  gpus: [4]
  sharing: {strategy: mps}
`
)

func size(memory, compute string) []func(*resourceapi.DeviceRequest) {
	var out []func(*resourceapi.DeviceRequest)
	if memory != "" {
		out = append(out, schedulertest.WithCapacity("memory", memory))
	}
	if compute != "" {
		out = append(out, schedulertest.WithCapacity("compute", compute))
	}
	return out
}

// consumed renders what a result consumed: "g0-1x-sized seats=1 memory=20Gi compute=25".
func consumed(r *resourceapi.AllocationResult) string {
	if r == nil {
		return "does not fit"
	}
	res := r.Devices.Results[0]
	out := res.Device
	for _, name := range []resourceapi.QualifiedName{draresources.SeatsCapacity, draresources.MemoryCapacity, draresources.ComputeCapacity} {
		if q, ok := res.ConsumedCapacity[name]; ok {
			out += fmt.Sprintf(" %s=%s", name, q.String())
		}
	}
	if res.ShareID == nil {
		out += " (no share ID)"
	}
	return out
}

func TestSizedClaimsConsumeWhatTheyAskRoundedUpToTheStep(t *testing.T) {
	tests := []struct {
		name            string
		memory, compute string
		want            string
	}{
		{"as asked", "20Gi", "25", "g0-1x-sized seats=1 memory=20Gi compute=25"},
		{"nothing asked: the group's equal share", "", "", "g0-1x-sized seats=1 memory=17Gi compute=12"},
		{"memory only: compute's default", "8Gi", "", "g0-1x-sized seats=1 memory=8Gi compute=12"},
		{"off the step: rounded up, not refused", "20.5Gi", "12.5", "g0-1x-sized seats=1 memory=21Gi compute=13"},
		{"below the minimum: the minimum", "100Mi", "0", "g0-1x-sized seats=1 memory=1Gi compute=1"},
		{"all of the GPU's memory in whole steps", "140Gi", "100", "g0-1x-sized seats=1 memory=140Gi compute=100"},
		// Rounded up to 141Gi: the GPU's last 411 MiB are no step.
		{"all of the GPU's memory", "143771Mi", "", "does not fit"},
		{"above the GPU's memory", "141Gi", "", "does not fit"},
		{"above all of the SMs", "", "101", "does not fit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
			if got := consumed(n.allocate(t, "a", classSized, size(tc.memory, tc.compute)...)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSizedGroupsHoldWhatTheirClaimsConsumeAndNoMore(t *testing.T) {
	n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
	// 60 + 60 GiB fit on 140.4 GiB; a third 60 does not, a 10 does.
	for i, want := range []string{
		"g0-1x-sized seats=1 memory=60Gi compute=12",
		"g0-1x-sized seats=1 memory=60Gi compute=12",
		"does not fit",
	} {
		if got := consumed(n.allocate(t, fmt.Sprintf("big-%d", i), classSized, size("60Gi", "")...)); got != want {
			t.Errorf("60Gi claim %d: %q, want %q", i, got, want)
		}
	}
	if got := consumed(n.allocate(t, "small", classSized, size("10Gi", "")...)); got != "g0-1x-sized seats=1 memory=10Gi compute=12" {
		t.Errorf("10Gi beside 120Gi: %q", got)
	}
	// 130Gi held: the default (17Gi) no longer fits.
	if got := consumed(n.allocate(t, "default", classSized)); got != "does not fit" {
		t.Errorf("the default size beside 130Gi: %q", got)
	}
	// Compute: 3x12 held; 64 more fit, then not even 1.
	if got := consumed(n.allocate(t, "sms", classSized, size("1Gi", "64")...)); got != "g0-1x-sized seats=1 memory=1Gi compute=64" {
		t.Errorf("64 %% beside 36: %q", got)
	}
	if got := consumed(n.allocate(t, "one-more", classSized, size("1Gi", "1")...)); got != "does not fit" {
		t.Errorf("1 %% beside 100: %q", got)
	}
}

func TestASizedGroupServesAtMostSeatsPerGroupClaims(t *testing.T) {
	n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
	got := n.fill(t, classSized, size("1Gi", "1")...)
	if len(got) != 8 {
		t.Errorf("%d claims of 1Gi and 1 %% fit on a group of 8 seats, want 8", len(got))
	}
	n = newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
	if got := n.fill(t, classSized); len(got) != 8 {
		t.Errorf("%d claims that ask nothing fit, want 8: the default is the equal share", len(got))
	}
}

func TestASizedClaimTakesExactlyOneSeat(t *testing.T) {
	for _, tc := range []struct{ seats, want string }{
		{"1", "g0-1x-sized seats=1 memory=17Gi compute=12"},
		{"2", "does not fit"},
		{"0", "g0-1x-sized seats=1 memory=17Gi compute=12"},
	} {
		n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
		if got := consumed(n.allocate(t, "a", classSized, schedulertest.WithCapacity("seats", tc.seats))); got != tc.want {
			t.Errorf("seats: %s: %q, want %q", tc.seats, got, tc.want)
		}
	}
}

func TestASizeOnAProfileThatIsNotSizedFitsNowhere(t *testing.T) {
	n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
	if got := consumed(n.allocate(t, "a", class1x, size("8Gi", "")...)); got != "does not fit" {
		t.Errorf("memory asked of an mps profile that is not sized: %q", got)
	}
	if got := consumed(n.allocate(t, "b", class1x)); got != "g4-1x seats=1" {
		t.Errorf("the same profile without a size: %q", got)
	}
}

func TestASizedTwoGPUGroupsMemoryIsPerGPU(t *testing.T) {
	n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
	// Each GPU has 140.4 GiB: 100Gi per GPU fits once, not twice.
	if got := consumed(n.allocate(t, "a", classSized2x, size("100Gi", "50")...)); got != "g23-2x-sized seats=1 memory=100Gi compute=50" {
		t.Errorf("100Gi per GPU on a 2x group: %q", got)
	}
	if got := consumed(n.allocate(t, "b", classSized2x, size("100Gi", "50")...)); got != "does not fit" {
		t.Errorf("a second 100Gi per GPU: %q", got)
	}
}

func TestPublishedSizesReadBackAsPlanned(t *testing.T) {
	n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
	found := 0
	for _, s := range n.cluster.Slices() {
		for _, d := range s.Spec.Devices {
			g := n.plan.GroupByDevice(d.Name)
			want, sized := draresources.GroupSizes(g)
			got, read := draresources.DeviceSizes(d)
			if sized != read || got != want {
				t.Errorf("%s: read %+v (%v), published from %+v (%v)", d.Name, got, read, want, sized)
			}
			if sized {
				found++
				if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
					t.Errorf("%s: a sized group must be a shared device", d.Name)
				}
			}
		}
	}
	if found != 2 {
		t.Errorf("%d sized devices, want 2 (G0, G23)", found)
	}
}

func TestConsumedSizeReadsWhatTheAllocatorGave(t *testing.T) {
	n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
	sizes, _ := draresources.GroupSizes(n.plan.GroupByDevice("g0-1x-sized"))
	result := func(cc map[resourceapi.QualifiedName]string) resourceapi.DeviceRequestAllocationResult {
		r := resourceapi.DeviceRequestAllocationResult{Device: "g0-1x-sized", ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range cc {
			r.ConsumedCapacity[k] = resource.MustParse(v)
		}
		return r
	}
	tests := []struct {
		name     string
		consumed map[resourceapi.QualifiedName]string
		want     string
	}{
		{"as the allocator writes it", map[resourceapi.QualifiedName]string{"seats": "1", "memory": "20Gi", "compute": "25"}, "{MemoryBytes:21474836480 ComputePercent:25}"},
		{"written by hand without a size: the defaults", nil, "{MemoryBytes:18253611008 ComputePercent:12}"},
		{"two seats", map[resourceapi.QualifiedName]string{"seats": "2"}, "error: device g0-1x-sized: consumed seats 2: a sized seat's claim takes exactly one seat"},
		{"off the step", map[resourceapi.QualifiedName]string{"memory": "1536Mi"}, "error: device g0-1x-sized: consumed memory 1536Mi is not a size the group offers (min 1073741824, steps of 1073741824, at most 150754820096)"},
		{"above the group", map[resourceapi.QualifiedName]string{"compute": "150"}, "error: device g0-1x-sized: consumed compute 150 is not a size the group offers (min 1, steps of 1, at most 100)"},
		{"none", map[resourceapi.QualifiedName]string{"memory": "0"}, "error: device g0-1x-sized: consumed memory 0 is not a size the group offers (min 1073741824, steps of 1073741824, at most 150754820096)"},
	}
	for _, tc := range tests {
		got, err := draresources.ConsumedSize(result(tc.consumed), sizes)
		s := fmt.Sprintf("%+v", got)
		if err != nil {
			s = "error: " + err.Error()
		}
		if s != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, s, tc.want)
		}
	}
}

// A request's devices are distinct devices: count: 2 takes two groups,
// never two shares of one group (so it is no way to a larger size).
func TestASizedRequestOfTwoTakesTwoGroupsNeverTwoSharesOfOne(t *testing.T) {
	n := newNode(t, "dgx-h200", sizedConfig, draresources.LayoutShared)
	if r, err := n.cluster.Allocate(ctx, schedulertest.Claim("two", classSized, 2, size("20Gi", "25")...), "node-1"); err != nil || r != nil {
		t.Errorf("two 20Gi shares of the one sized group: %v %v, want no fit", r, err)
	}
	n = newNode(t, "dgx-h200", `
profiles:
- {resource: kyb.ai/gpu-1x-sized, seatsPerGroup: 8, gpus: [0, 1], sharing: {strategy: mps, sized: true}}
`, draresources.LayoutShared)
	r, err := n.cluster.Allocate(ctx, schedulertest.Claim("two", classSized, 2, size("20Gi", "25")...), "node-1")
	if err != nil || r == nil || len(r.Devices.Results) != 2 || r.Devices.Results[0].Device == r.Devices.Results[1].Device {
		t.Errorf("two 20Gi shares over two sized groups: %+v %v, want one on each", r, err)
	}
}

// What kyb-scheduler predicts a sized claim consumes (v1alpha1's
// SizeRule.Consumed, over the sizes the device publishes) is what the
// allocator consumes: as asked, off the step, below the minimum,
// fractional, left out, under the default rules and under steps of their
// own.
func TestConsumedIsWhatTheAllocatorConsumes(t *testing.T) {
	const stepped = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  sharing:
    strategy: mps
    sized: true
    sizes:
      memory: {default: 14Gi, min: 2Gi, step: 4Gi}
      compute: {default: 10, min: 5, step: 5}
`
	requests := [][2]string{
		{"", ""}, {"20Gi", "25"}, {"20.5Gi", "12.5"}, {"100Mi", "0"}, {"3Gi", "7"},
		{"8Gi", ""}, {"", "0.5"}, {"14Gi", "10"}, {"1", "1"}, {"40000Mi", "99.9"},
	}
	for _, config := range []string{sizedConfig, stepped} {
		for _, req := range requests {
			n := newNode(t, "dgx-h200", config, draresources.LayoutShared)
			r := n.allocate(t, "a", classSized, size(req[0], req[1])...)
			if r == nil {
				t.Errorf("memory %q, compute %q: fits no group", req[0], req[1])
				continue
			}
			res := r.Devices.Results[0]
			var d *resourceapi.Device
			for _, s := range n.cluster.Slices() {
				for i := range s.Spec.Devices {
					if s.Spec.Devices[i].Name == res.Device {
						d = &s.Spec.Devices[i]
					}
				}
			}
			sizes, ok := draresources.DeviceSizes(*d)
			if !ok {
				t.Fatalf("%s publishes no sizes", res.Device)
			}
			for _, c := range []struct {
				name  resourceapi.QualifiedName
				asked string
				rule  planner.SizeRange
			}{{draresources.MemoryCapacity, req[0], sizes.Memory}, {draresources.ComputeCapacity, req[1], sizes.Compute}} {
				var requested int64
				if c.asked != "" {
					q := resource.MustParse(c.asked)
					requested = q.Value()
				}
				rule := v1alpha1.SizeRule{Default: c.rule.Default, Min: c.rule.Min, Step: c.rule.Step}
				got := rule.Consumed(requested, c.asked != "")
				took := res.ConsumedCapacity[c.name]
				if took.CmpInt64(got) != 0 {
					t.Errorf("memory %q, compute %q: %s consumed %s by the allocator, %d by SizeRule.Consumed", req[0], req[1], c.name, took.String(), got)
				}
				if !rule.Allows(got) {
					t.Errorf("memory %q, compute %q: %s %d consumed is not allowed by the rule", req[0], req[1], c.name, got)
				}
			}
		}
	}
}
