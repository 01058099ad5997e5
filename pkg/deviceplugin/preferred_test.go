package deviceplugin

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// testResource builds one resource of the exclusive layout without
// sockets, for calling its methods directly.
func testResource(tb testing.TB, preset, config, name string) *resource {
	tb.Helper()
	node := simnodetest.New(tb, preset, config)
	inv, plan := node.Inv, node.Plan
	opts := Options{Inventory: inv, Plan: plan, Edits: containeredits.Options{DeviceNumbers: node.Sim.DeviceNumbers}}
	if err := opts.setDefaults(); err != nil {
		tb.Fatal(err)
	}
	layout, _ := plan.ExclusiveLayout()
	for _, prof := range layout.Profiles {
		if prof.Resource == name {
			return newResource(layout, prof, &opts, nil, nil, make(chan struct{}), klog.Background())
		}
	}
	tb.Fatalf("no resource %s in the layout", name)
	return nil
}

// On dgx-h100, with these GPU lists, 1x has groups G4 G5 G6 G7 of 4 seats
// each. All GPUs are NVLink peers; G4/G5 and G6/G7 share a PCIe root. The
// planner's pack order is G4 G5 G6 G7, its spread order G4 G6 G5 G7.
const preferConfig = `
allocationPolicy: %s
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, gpus: [4, 5, 6, 7]}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 2, gpus: [0, 1, 2, 3]}
`

// seats names seats of a 1x group: seats("g5", 0, 1) = g5-1x-seat-0, g5-1x-seat-1.
func seats(group string, ns ...int) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = fmt.Sprintf("%s-1x-seat-%d", group, n)
	}
	return out
}

// all1x is every 1x seat except those listed as held.
func all1x(held ...string) []string {
	var out []string
	for _, g := range []string{"g4", "g5", "g6", "g7"} {
		for _, id := range seats(g, 0, 1, 2, 3) {
			if !slices.Contains(held, id) {
				out = append(out, id)
			}
		}
	}
	return out
}

func join(lists ...[]string) []string { return slices.Concat(lists...) }

func TestGetPreferredAllocation(t *testing.T) {
	tests := []struct {
		name      string
		policy    string
		available []string
		must      []string
		size      int
		want      []string
	}{
		{"pack, all free: first group in pack order", "pack", all1x(), nil, 2, seats("g4", 0, 1)},
		{"pack: the group in use first", "pack", all1x(seats("g5", 0)...), nil, 2, seats("g5", 1, 2)},
		{"pack: the fullest group in use that fits", "pack", all1x(join(seats("g5", 0, 1, 2), seats("g6", 0, 1))...), nil, 2, seats("g6", 2, 3)},
		{"pack: one seat goes to the fullest group", "pack", all1x(join(seats("g5", 0, 1, 2), seats("g6", 0, 1))...), nil, 1, seats("g5", 3)},
		{"spread, all free: first group in spread order", "spread", all1x(), nil, 2, seats("g4", 0, 1)},
		{"spread: the emptiest group", "spread", all1x(seats("g4", 0)...), nil, 2, seats("g6", 0, 1)},
		{"spread: the emptiest, then spread order", "spread", all1x(join(seats("g4", 0), seats("g6", 0))...), nil, 1, seats("g5", 0)},
		{"larger than a group, pack: fewest groups, pack order", "pack", all1x(), nil, 6, join(seats("g4", 0, 1, 2, 3), seats("g5", 0, 1))},
		{"larger than a group, spread: fewest groups, spread order", "spread", all1x(), nil, 6, join(seats("g4", 0, 1, 2, 3), seats("g6", 0, 1))},
		{"larger than a group, partly used", "pack", all1x(join(seats("g4", 0, 1), seats("g5", 0))...), nil, 6, join(seats("g6", 0, 1, 2, 3), seats("g7", 0, 1))},
		{"must-include stays on its group", "pack", all1x(), seats("g6", 1), 3, seats("g6", 1, 0, 2)},
		{"must-include group first, then one group", "pack", all1x(), seats("g7", 2), 5, join(seats("g7", 2, 0, 1, 3), seats("g4", 0))},
		{"must-include on two groups", "spread", all1x(), join(seats("g7", 3), seats("g5", 1)), 4, join(seats("g5", 1), seats("g7", 3), seats("g5", 0, 2))},
		{"must-include fills the request", "pack", all1x(), join(seats("g7", 3), seats("g4", 1)), 1, seats("g4", 1)},
		{"size equals what is available", "pack", join(seats("g7", 0), seats("g5", 3)), nil, 2, join(seats("g5", 3), seats("g7", 0))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := testResource(t, "dgx-h100", fmt.Sprintf(preferConfig, tc.policy), "kyb.ai/gpu-1x-seat")
			got := r.prefer(tc.available, tc.must, tc.size)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
			// The kubelet's order of the available IDs does not matter.
			shuffled := slices.Clone(tc.available)
			rand.New(rand.NewSource(1)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			if again := r.prefer(shuffled, tc.must, tc.size); !slices.Equal(again, got) {
				t.Errorf("shuffled input: %v, first answer %v", again, got)
			}
		})
	}
}

func TestGetPreferredAllocationNeverFailsOnGarbage(t *testing.T) {
	r := testResource(t, "dgx-h100", fmt.Sprintf(preferConfig, "pack"), "kyb.ai/gpu-1x-seat")
	tests := []struct {
		name      string
		available []string
		must      []string
		size      int32
		want      []string
	}{
		{"unknown, empty, duplicate and foreign IDs ignored", []string{"bogus", "", "g01-2x-seat-0", "g7-1x-seat-2", "g7-1x-seat-2", "GPU-0"}, nil, 1, seats("g7", 2)},
		{"must-include not available ignored", seats("g6", 0, 1), join(seats("g4", 0), []string{"nope"}), 2, seats("g6", 0, 1)},
		{"more than available: what there is", seats("g6", 3), nil, 100, seats("g6", 3)},
		{"size zero", all1x(), nil, 0, nil},
		{"negative size", all1x(), seats("g4", 0), -3, nil},
		{"nothing available", nil, seats("g4", 0), 2, []string{}},
		{"huge size", all1x(), nil, 1 << 30, all1x()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := r.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
				{AvailableDeviceIDs: tc.available, MustIncludeDeviceIDs: tc.must, AllocationSize: tc.size},
			}})
			if err != nil {
				t.Fatalf("error %v; an error would reject the pod", err)
			}
			got := resp.ContainerResponses[0].DeviceIDs
			if len(got) != len(tc.want) || (len(got) > 0 && !slices.Equal(got, tc.want)) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	// A request with no container requests, and several in one call: one
	// answer per container, in request order.
	resp, err := r.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{})
	if err != nil || len(resp.ContainerResponses) != 0 {
		t.Errorf("empty request: %v %v", resp, err)
	}
	resp, err = r.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: all1x(), AllocationSize: 1},
		{AvailableDeviceIDs: seats("g7", 1, 2), AllocationSize: 2},
	}})
	if err != nil || len(resp.ContainerResponses) != 2 ||
		!slices.Equal(resp.ContainerResponses[0].DeviceIDs, seats("g4", 0)) || !slices.Equal(resp.ContainerResponses[1].DeviceIDs, seats("g7", 1, 2)) {
		t.Errorf("two containers: %v %v", resp, err)
	}
}

// benchConfig is 8 GPUs with 4 profiles of 8 seats per group; overprovision
// keeps every group in the exclusive layout: 8, 4, 2 and 1 groups.
const benchConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 8, allowOverprovision: true}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 8, allowOverprovision: true}
- {resource: kyb.ai/gpu-4x-seat, seatsPerGroup: 8, allowOverprovision: true}
- {resource: kyb.ai/gpu-8x-seat, seatsPerGroup: 8, allowOverprovision: true}
`

// BenchmarkGetPreferredAllocation measures one kubelet call (one container)
// on each profile, with every other seat in use: a request for one seat,
// and one for 9 seats, which no group of 8 can hold.
func BenchmarkGetPreferredAllocation(b *testing.B) {
	for _, name := range []string{"1x", "2x", "4x", "8x"} {
		r := testResource(b, "dgx-h100", benchConfig, "kyb.ai/gpu-"+name+"-seat")
		var available []string
		for i, id := range r.ids {
			if i%2 == 1 {
				available = append(available, id)
			}
		}
		for _, size := range []int32{1, 9} {
			if int(size) > len(available) {
				continue
			}
			req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: available, AllocationSize: size}}}
			b.Run(fmt.Sprintf("%s/groups=%d/size=%d", name, len(r.groups), size), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					resp, _ := r.GetPreferredAllocation(context.Background(), req)
					if len(resp.ContainerResponses[0].DeviceIDs) != int(size) {
						b.Fatalf("answer %v", resp.ContainerResponses[0].DeviceIDs)
					}
				}
			})
		}
	}
}

func TestPreferredAnswerIsAvailableAndOneGroupWherePossible(t *testing.T) {
	// Property over many random states: the answer has size IDs (or all
	// that are available), all of them available, none twice; and where a
	// group has size free seats, all on one group.
	r := testResource(t, "dgx-h100", benchConfig, "kyb.ai/gpu-1x-seat")
	rng := rand.New(rand.NewSource(7))
	for round := 0; round < 500; round++ {
		var available []string
		free := map[string]int{}
		for _, id := range r.ids {
			if rng.Intn(3) > 0 {
				available = append(available, id)
				free[strings.SplitN(id, "-seat-", 2)[0]]++
			}
		}
		size := 1 + rng.Intn(10)
		got := r.prefer(available, nil, size)
		if len(got) != min(size, len(available)) {
			t.Fatalf("round %d: %d IDs for size %d of %d available", round, len(got), size, len(available))
		}
		groups := map[string]bool{}
		for i, id := range got {
			if !slices.Contains(available, id) || slices.Contains(got[:i], id) {
				t.Fatalf("round %d: %s not available or twice in %v", round, id, got)
			}
			groups[strings.SplitN(id, "-seat-", 2)[0]] = true
		}
		fits := false
		for _, n := range free {
			fits = fits || n >= size
		}
		if fits && len(groups) != 1 {
			t.Fatalf("round %d: size %d fits one group (%v) but the answer spans %v", round, size, free, got)
		}
	}
}

// BenchmarkGetPreferredAllocationScaling shows the cost growing linearly
// with the groups: 1x groups of 8 seats on synthetic PCIe nodes of 4 to 32
// GPUs (the most a node may have), every other seat in use, a request for 3
// seats.
func BenchmarkGetPreferredAllocationScaling(b *testing.B) {
	for _, gpus := range []int{4, 8, 16, 32} {
		var topo strings.Builder
		topo.WriteString("apiVersion: kyb.ai/v1alpha1\nkind: NodeTopology\ndriverVersion: \"580.95.05\"\ncudaDriverVersion: \"13.0\"\n" +
			"defaults: {productName: NVIDIA L40S, architecture: ada, cudaComputeCapability: \"8.9\", memoryMiB: 46068}\ngpus:\n")
		for i := 0; i < gpus; i++ {
			fmt.Fprintf(&topo, "- {index: %d, pciBusID: \"0000:%02x:%02x.0\", numaNode: %d, pcieRoot: pci0000:%02x}\n", i, i/32+1, i%32, i*2/gpus, i/4)
		}
		file := b.TempDir() + "/topology.yaml"
		if err := os.WriteFile(file, []byte(topo.String()), 0o600); err != nil {
			b.Fatal(err)
		}
		r := testResource(b, file, "profiles: [{resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 8}]\n", "kyb.ai/gpu-1x-seat")
		var available []string
		for i, id := range r.ids {
			if i%2 == 1 {
				available = append(available, id)
			}
		}
		req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: available, AllocationSize: 3}}}
		b.Run(fmt.Sprintf("groups=%d", len(r.groups)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, _ := r.GetPreferredAllocation(context.Background(), req)
				if len(resp.ContainerResponses[0].DeviceIDs) != 3 {
					b.Fatalf("answer %v", resp.ContainerResponses[0].DeviceIDs)
				}
			}
		})
	}
}
