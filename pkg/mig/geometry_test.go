package mig_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// migPresets are the simulated nodes of every MIG table: A100-40GB,
// A100-80GB, H100-80GB and H200.
var migPresets = []string{"dgx-a100", "nvlink-2x4", "dgx-h100", "dgx-h200"}

// readModel reads the MIG geometry of GPU 0 of a simulated node through
// NVML, as discovery does.
func readModel(t testing.TB, preset string) mig.Model {
	t.Helper()
	node, err := simnode.Load(preset, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	dev, ret := node.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	name, _ := dev.GetName()
	mem, _ := dev.GetMemoryInfo()
	m, err := mig.Read(dev, name, mem.Total)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// models are the geometries of every MIG table.
func models(t testing.TB) []mig.Model {
	var out []mig.Model
	for _, p := range migPresets {
		out = append(out, readModel(t, p))
	}
	return out
}

// at is profile name at {start}.
func at(t *testing.T, m mig.Model, name string, start int) mig.Instance {
	t.Helper()
	p, err := m.Profile(name)
	if err != nil {
		t.Fatal(err)
	}
	return mig.Instance{Profile: p, Placement: mig.Placement{Start: start, Size: p.MemorySlices}}
}

func TestOverlaps(t *testing.T) {
	for _, tt := range []struct {
		a, b mig.Placement
		want bool
	}{
		{mig.Placement{0, 4}, mig.Placement{4, 4}, false},
		{mig.Placement{0, 4}, mig.Placement{2, 2}, true},
		{mig.Placement{0, 8}, mig.Placement{6, 1}, true},
		{mig.Placement{6, 2}, mig.Placement{5, 1}, false},
		{mig.Placement{6, 2}, mig.Placement{6, 1}, true},
		{mig.Placement{3, 1}, mig.Placement{3, 1}, true},
		{mig.Placement{2, 1}, mig.Placement{3, 1}, false},
	} {
		if got := mig.Overlaps(tt.a, tt.b); got != tt.want {
			t.Errorf("mig.Overlaps(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
		if got := mig.Overlaps(tt.b, tt.a); got != tt.want {
			t.Errorf("mig.Overlaps(%s, %s) = %v, want %v", tt.b, tt.a, got, tt.want)
		}
	}
}

// TestOverlapsAgreesWithSliceSets checks mig.Overlaps against the memory
// slices each placement covers, written out as sets, for every pair of
// placements of every model.
func TestOverlapsAgreesWithSliceSets(t *testing.T) {
	for _, m := range models(t) {
		all := m.Instances()
		for _, a := range all {
			if a.Placement.Start < 0 || a.Placement.End() > m.MemorySlices {
				t.Errorf("%s: %s lies outside the %d memory slices", m.Name, a, m.MemorySlices)
			}
			for _, b := range all {
				shared := false
				for s := a.Placement.Start; s < a.Placement.End(); s++ {
					if s >= b.Placement.Start && s < b.Placement.End() {
						shared = true
					}
				}
				if got := mig.Overlaps(a.Placement, b.Placement); got != shared {
					t.Errorf("%s: mig.Overlaps(%s, %s) = %v, but sharing a slice is %v", m.Name, a, b, got, shared)
				}
			}
		}
	}
}

func TestCoexist(t *testing.T) {
	h100 := readModel(t, "dgx-h100")
	a100 := readModel(t, "dgx-a100")
	seven := func(m mig.Model, name string) []mig.Instance {
		var out []mig.Instance
		for s := 0; s < 7; s++ {
			out = append(out, at(t, m, name, s))
		}
		return out
	}
	for _, tt := range []struct {
		name      string
		model     mig.Model
		instances []mig.Instance
		err       string
	}{
		{name: "nothing", model: h100},
		{name: "seven 1g.10gb", model: h100, instances: seven(h100, "1g.10gb")},
		{name: "seven 1g.5gb on A100-40GB", model: a100, instances: seven(a100, "1g.5gb")},
		{name: "3g and 3g", model: h100, instances: []mig.Instance{at(t, h100, "3g.40gb", 0), at(t, h100, "3g.40gb", 4)}},
		{name: "4g and 3g", model: h100, instances: []mig.Instance{at(t, h100, "4g.40gb", 0), at(t, h100, "3g.40gb", 4)}},
		{name: "three 2g and a 1g", model: h100, instances: []mig.Instance{at(t, h100, "2g.20gb", 0), at(t, h100, "2g.20gb", 2), at(t, h100, "2g.20gb", 4), at(t, h100, "1g.10gb", 6)}},
		{name: "four 1g.20gb", model: h100, instances: []mig.Instance{at(t, h100, "1g.20gb", 0), at(t, h100, "1g.20gb", 2), at(t, h100, "1g.20gb", 4), at(t, h100, "1g.20gb", 6)}},
		{name: "one +me beside six 1g", model: h100, instances: append(seven(h100, "1g.10gb")[1:], at(t, h100, "1g.10gb+me", 0))},
		{
			name: "4g overlapping 2g at start 2", model: h100,
			instances: []mig.Instance{at(t, h100, "4g.40gb", 0), at(t, h100, "2g.20gb", 2)},
			err:       "instance 1 (2g.20gb@{2}:2) overlaps instance 0 (4g.40gb@{0}:4) on memory slices",
		},
		{
			name: "7g and anything", model: h100,
			instances: []mig.Instance{at(t, h100, "7g.80gb", 0), at(t, h100, "1g.10gb", 6)},
			err:       "instance 1 (1g.10gb@{6}:1) overlaps instance 0 (7g.80gb@{0}:8)",
		},
		{
			name: "two +me", model: h100,
			instances: []mig.Instance{at(t, h100, "1g.10gb+me", 0), at(t, h100, "1g.10gb+me", 1)},
			err:       "instance 1 (1g.10gb+me@{1}:1): NVIDIA H100 80GB HBM3 allows at most 1 instance(s) of 1g.10gb+me",
		},
		{
			name: "3g at a start it has not", model: h100,
			instances: []mig.Instance{at(t, h100, "3g.40gb", 2)},
			err:       "3g.40gb cannot start at {2}:4 on NVIDIA H100 80GB HBM3; its placements are {0,4}:4",
		},
		{
			name: "1g on the eighth slice", model: h100,
			instances: []mig.Instance{at(t, h100, "1g.10gb", 7)},
			err:       "its placements are {0,1,2,3,4,5,6}:1",
		},
		{
			name: "a profile of another model", model: h100,
			instances: []mig.Instance{at(t, a100, "1g.5gb", 0)},
			err:       "profile ID 19 is 1g.10gb on NVIDIA H100 80GB HBM3",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.model.Coexist(tt.instances)
			if tt.err == "" {
				if err != nil {
					t.Fatalf("Coexist(%v): %v", tt.instances, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("Coexist(%v) = %v, want an error with %q", tt.instances, err, tt.err)
			}
		})
	}
}

// TestCoexistCountsComputeSlices uses a made-up model whose memory slices
// outnumber its compute slices, since on the real tables the placements
// alone keep the compute slices within seven.
func TestCoexistCountsComputeSlices(t *testing.T) {
	wide := mig.Profile{ID: 1, Name: "2g.wide", MemorySlices: 1, ComputeSlices: 2, MaxInstances: 4,
		Placements: []mig.Placement{{0, 1}, {1, 1}, {2, 1}, {3, 1}}}
	m := mig.Model{Name: "toy", MemorySlices: 4, ComputeSlices: 5, Profiles: []mig.Profile{wide}}
	ok := []mig.Instance{{wide, mig.Placement{0, 1}}, {wide, mig.Placement{1, 1}}}
	if err := m.Coexist(ok); err != nil {
		t.Fatalf("two instances, 4 compute slices: %v", err)
	}
	err := m.Coexist(append(ok, mig.Instance{wide, mig.Placement{2, 1}}))
	want := "instance 2 (2g.wide@{2}:1): the instances take 6 compute slices, toy has 5"
	if err == nil || err.Error() != want {
		t.Fatalf("three instances: %v, want %q", err, want)
	}
}

// TestEveryInstanceStandsAlone: each (profile, placement) of the tables is
// one the rules accept on an empty GPU, and the tables hold the 25 of
// them that A100s, H100s and H200s offer.
func TestEveryInstanceStandsAlone(t *testing.T) {
	for _, m := range models(t) {
		all := m.Instances()
		if len(all) != 25 {
			t.Errorf("%s: %d instances, want 25", m.Name, len(all))
		}
		for _, in := range all {
			if err := m.Coexist([]mig.Instance{in}); err != nil {
				t.Errorf("%s: %v", m.Name, err)
			}
		}
	}
}

func ExampleModel_Coexist() {
	// GPU 0 of a simulated DGX H100, read as discovery reads a real GPU.
	node, _ := simnode.Load("dgx-h100", "node-1")
	dev, _ := node.NVML().DeviceGetHandleByIndex(0)
	name, _ := dev.GetName()
	mem, _ := dev.GetMemoryInfo()
	m, _ := mig.Read(dev, name, mem.Total)
	four, _ := m.Profile("4g.40gb")
	two, _ := m.Profile("2g.20gb")
	fmt.Println(m.Coexist([]mig.Instance{{four, mig.Placement{0, 4}}, {two, mig.Placement{4, 2}}}))
	fmt.Println(m.Coexist([]mig.Instance{{four, mig.Placement{0, 4}}, {two, mig.Placement{2, 2}}}))
	// Output:
	// <nil>
	// instance 1 (2g.20gb@{2}:2) overlaps instance 0 (4g.40gb@{0}:4) on memory slices
}
