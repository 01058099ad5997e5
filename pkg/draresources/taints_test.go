package draresources_test

import (
	"fmt"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// taintedNode is newNode with GPU faults published as device taints.
func taintedNode(t *testing.T, preset, config string, layout draresources.Layout, faults draresources.Faults) *node {
	t.Helper()
	n := newNode(t, preset, config, layout)
	res := draresources.Resources(n.plan, n.inv, "node-1", layout)
	draresources.Taint(res, n.plan, faults)
	n.cluster = schedulertest.New(schedulertest.SchedulerFeatures())
	n.cluster.AddNode("node-1", res, driver.Name)
	n.cluster.AddClasses(draresources.DeviceClasses(n.plan.Profiles, draresources.DeviceClassOptions{ExtendedResources: true})...)
	return n
}

// taintsOf renders the tainted devices as "device key=value:effect".
func taintsOf(n *node, faults draresources.Faults, layout draresources.Layout) []string {
	res := draresources.Resources(n.plan, n.inv, "node-1", layout)
	draresources.Taint(res, n.plan, faults)
	var out []string
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			for _, tn := range d.Taints {
				out = append(out, fmt.Sprintf("%s %s=%s:%s", d.Name, tn.Key, tn.Value, tn.Effect))
			}
		}
	}
	slices.Sort(out)
	return out
}

var xid79 = draresources.Fault{Reason: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}

func TestTaintsOnlyTheGroupsThatContainTheGPU(t *testing.T) {
	n := newNode(t, "dgx-h100", "seed", draresources.LayoutShared)
	faults := draresources.Faults{2: xid79}
	if got, want := taintsOf(n, faults, draresources.LayoutShared), []string{
		"g2-1x gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
		"g23-2x gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
	}; !slices.Equal(got, want) {
		t.Errorf("shared layout:\n got %q\nwant %q", got, want)
	}
	// The per-seat layout of the seed gives 2x G01 and G23 (three seats
	// each) and 1x GPUs 4-7: GPU 2 is only in G23.
	if got, want := taintsOf(n, faults, draresources.LayoutPerSeat), []string{
		"g23-2x-seat-0 gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
		"g23-2x-seat-1 gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
		"g23-2x-seat-2 gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
	}; !slices.Equal(got, want) {
		t.Errorf("per-seat layout:\n got %q\nwant %q", got, want)
	}
	if got := taintsOf(n, nil, draresources.LayoutShared); len(got) != 0 {
		t.Errorf("healthy node has taints %q", got)
	}
}

func TestGroupTaint(t *testing.T) {
	lost := draresources.Fault{Reason: "gpu-lost", Effect: resourceapi.DeviceTaintEffectNoExecute}
	ecc := draresources.Fault{Reason: "double-bit-ecc", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	for _, tt := range []struct {
		name   string
		gpus   []int
		faults draresources.Faults
		want   string // "" for no taint
	}{
		{"healthy group", []int{0, 1}, draresources.Faults{2: xid79}, ""},
		{"one GPU", []int{2, 3}, draresources.Faults{2: xid79}, "gpu.kyb.ai/unhealthy=xid-79:NoSchedule"},
		{"the first GPU's reason among equals", []int{3, 2}, draresources.Faults{3: ecc, 2: xid79}, "gpu.kyb.ai/unhealthy=xid-79:NoSchedule"},
		{"the strongest effect wins", []int{0, 1, 2, 3}, draresources.Faults{1: ecc, 3: lost}, "gpu.kyb.ai/unhealthy=gpu-lost:NoExecute"},
		{"no effect means NoSchedule", []int{0}, draresources.Faults{0: {Reason: "xid-48"}}, "gpu.kyb.ai/unhealthy=xid-48:NoSchedule"},
		{"a reason is made a label value", []int{0}, draresources.Faults{0: {Reason: "NVML: GPU is lost!"}}, "gpu.kyb.ai/unhealthy=NVML-GPU-is-lost:NoSchedule"},
		{"a long reason is cut at 63", []int{0}, draresources.Faults{0: {Reason: "x123456789-123456789-123456789-123456789-123456789-123456789-123456789"}},
			"gpu.kyb.ai/unhealthy=x123456789-123456789-123456789-123456789-123456789-123456789-12:NoSchedule"},
		{"an empty reason", []int{0}, draresources.Faults{0: {Reason: "::"}}, "gpu.kyb.ai/unhealthy=unhealthy:NoSchedule"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if tn, ok := draresources.GroupTaint(tt.gpus, tt.faults); ok {
				got = fmt.Sprintf("%s=%s:%s", tn.Key, tn.Value, tn.Effect)
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func gpuIs(i int) func(*resourceapi.DeviceRequest) {
	return schedulertest.WithSelector(fmt.Sprintf(`device.attributes["gpu.kyb.ai"].gpuIndices == "%d"`, i))
}

func tolerate(effect resourceapi.DeviceTaintEffect) func(*resourceapi.DeviceRequest) {
	return schedulertest.WithTolerations(resourceapi.DeviceToleration{Key: draresources.TaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: effect})
}

func TestSchedulerAvoidsTaintedGroupsUnlessTolerated(t *testing.T) {
	n := taintedNode(t, "dgx-h100", "seed", draresources.LayoutShared, draresources.Faults{2: xid79})
	if r := n.allocate(t, "on-gpu2", class1x, gpuIs(2)); r != nil {
		t.Fatalf("a claim without a toleration got %s on the unhealthy GPU", r.Devices.Results[0].Device)
	}
	r := n.allocate(t, "on-gpu2-tolerating", class1x, gpuIs(2), tolerate(resourceapi.DeviceTaintEffectNoSchedule))
	if r == nil || r.Devices.Results[0].Device != "g2-1x" {
		t.Fatalf("a claim tolerating the taint got %v, want g2-1x", r)
	}
	if got := r.Devices.Results[0].Tolerations; len(got) != 1 || got[0].Key != draresources.TaintKey {
		t.Errorf("the allocation records tolerations %v", got)
	}
}

func TestUnhealthyGPUTakesOnlyItsGroupsOutOfScheduling(t *testing.T) {
	n := taintedNode(t, "dgx-h100", "seed", draresources.LayoutShared, draresources.Faults{2: xid79})
	// Seven healthy 1x groups of four seats; G2 is left out.
	got := count(n.fill(t, class1x))
	want := map[string]int{"g0-1x": 4, "g1-1x": 4, "g3-1x": 4, "g4-1x": 4, "g5-1x": 4, "g6-1x": 4, "g7-1x": 4}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("1x seats: %v, want %v", got, want)
	}
	n = taintedNode(t, "dgx-h100", "seed", draresources.LayoutShared, draresources.Faults{2: xid79})
	got = count(n.fill(t, class2x))
	want = map[string]int{"g01-2x": 3, "g45-2x": 3, "g67-2x": 3}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("2x seats: %v, want %v", got, want)
	}
}

func TestNoExecuteTaintNeedsAMatchingToleration(t *testing.T) {
	lost := draresources.Fault{Reason: "gpu-lost", Effect: resourceapi.DeviceTaintEffectNoExecute}
	n := taintedNode(t, "dgx-h100", "seed", draresources.LayoutShared, draresources.Faults{5: lost})
	if r := n.allocate(t, "no-schedule-only", class1x, gpuIs(5), tolerate(resourceapi.DeviceTaintEffectNoSchedule)); r != nil {
		t.Fatalf("a NoSchedule toleration let a claim onto a NoExecute taint: %v", r.Devices.Results[0].Device)
	}
	if r := n.allocate(t, "any-effect", class1x, gpuIs(5), tolerate("")); r == nil || r.Devices.Results[0].Device != "g5-1x" {
		t.Fatalf("a toleration of every effect got %v, want g5-1x", r)
	}
}

func TestPerSeatLayoutTaintsKeepTheSchedulerOff(t *testing.T) {
	n := taintedNode(t, "dgx-h100", "seed", draresources.LayoutPerSeat, draresources.Faults{3: xid79})
	got := count(n.fill(t, class2x))
	if want := map[string]int{"g01-2x-seat-0": 1, "g01-2x-seat-1": 1, "g01-2x-seat-2": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("2x seats with GPU 3 unhealthy: %v, want %v", got, want)
	}
}

// TaintDevices taints the devices it names, once per key: a device that
// its GPU's fault tainted keeps that taint alone.
func TestTaintDevicesKeepsOneTaintPerKey(t *testing.T) {
	n := newNode(t, "dgx-h100", "seed", draresources.LayoutShared)
	res := draresources.Resources(n.plan, n.inv, "node-1", draresources.LayoutShared)
	draresources.Taint(res, n.plan, draresources.Faults{2: xid79})
	draresources.TaintDevices(res, map[string]resourceapi.DeviceTaint{
		"g2-1x":   {Key: draresources.TaintKey, Value: "mig-instance-gone", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		"g3-1x":   {Key: draresources.TaintKey, Value: "gone: made again?", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		"g01-2x":  {Key: draresources.FencedTaintKey, Value: "seats-unknown", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		"no-such": {Key: draresources.TaintKey, Value: "x", Effect: resourceapi.DeviceTaintEffectNoSchedule},
	})
	var got []string
	for _, s := range res.Pools["node-1"].Slices {
		for _, d := range s.Devices {
			for _, tn := range d.Taints {
				got = append(got, fmt.Sprintf("%s %s=%s:%s", d.Name, tn.Key, tn.Value, tn.Effect))
			}
		}
	}
	slices.Sort(got)
	want := []string{
		"g01-2x gpu.kyb.ai/fenced=seats-unknown:NoSchedule",
		"g2-1x gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
		"g23-2x gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
		"g3-1x gpu.kyb.ai/unhealthy=gone-made-again:NoSchedule",
	}
	if !slices.Equal(got, want) {
		t.Errorf("taints:\n got %q\nwant %q", got, want)
	}
}
