package draresources_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// presetModel is the MIG geometry of GPU 0 of a preset, as discovery
// reads it through NVML.
func presetModel(t testing.TB, preset string) mig.Model {
	t.Helper()
	_, inv := simnodetest.Inventory(t, preset, "node-1")
	if inv.GPUs[0].MIG == nil {
		t.Fatalf("%s: GPU 0 has no MIG geometry: %s", preset, inv.GPUs[0].NoMIG)
	}
	return *inv.GPUs[0].MIG
}

// everyMIGProfile is the 1x…8x profiles and every MIG profile of model on
// every GPU.
func everyMIGProfile(model mig.Model) string {
	var b strings.Builder
	b.WriteString("profiles:\n")
	for _, size := range []int{1, 2, 4, 8} {
		fmt.Fprintf(&b, "- {resource: kyb.ai/gpu-%dx-seat}\n", size)
	}
	for _, p := range model.Profiles {
		fmt.Fprintf(&b, "- {resource: kyb.ai/mig-%s, mig: {profile: %q}}\n", strings.ReplaceAll(p.Name, "+", "-"), p.Name)
	}
	return b.String()
}

// counterModel sums what a set of published devices consumes and says
// whether the pool's counters allow it, as the allocator does.
type counterModel struct {
	values  map[string]int64 // set/counter
	devices map[string]resourceapi.Device
}

func newCounterModel(res resourceslice.DriverResources) *counterModel {
	m := &counterModel{values: map[string]int64{}, devices: map[string]resourceapi.Device{}}
	for _, s := range res.Pools["node-1"].Slices {
		for _, cs := range s.SharedCounters {
			for name, c := range cs.Counters {
				m.values[cs.Name+"/"+name] = c.Value.Value()
			}
		}
		for _, d := range s.Devices {
			m.devices[d.Name] = d
		}
	}
	return m
}

func (m *counterModel) fits(names []string) bool {
	used := map[string]int64{}
	for _, n := range names {
		for _, cc := range m.devices[n].ConsumesCounters {
			for name, c := range cc.Counters {
				key := cc.CounterSet + "/" + name
				used[key] += c.Value.Value()
				if used[key] > m.values[key] {
					return false
				}
			}
		}
	}
	return true
}

// The counters decide exactly what mig.Coexist decides, for every set of
// instances of every profile of the model on one GPU: the walk visits
// every set the counters allow and, from each, tries every further
// instance and the whole GPU's 1x group.
func TestMIGCountersAgreeWithCoexist(t *testing.T) {
	for _, tc := range []struct{ preset, model string }{{"dgx-h100", "H100-80GB"}, {"dgx-a100", "A100-40GB"}, {"dgx-h200", "H200"}, {fourSlices, "four memory slices"}} {
		t.Run(tc.model, func(t *testing.T) {
			model := presetModel(t, tc.preset)
			n := newNode(t, tc.preset, everyMIGProfile(model), draresources.LayoutShared)
			m := newCounterModel(draresources.Resources(n.plan, n.inv, "node-1", draresources.LayoutShared))
			var names []string
			instance := map[string]mig.Instance{}
			for _, d := range n.plan.MIGDevices() {
				if d.GPU.Index() == 0 {
					names = append(names, d.DeviceName())
					instance[d.DeviceName()] = d.Instance()
				}
			}
			if len(names) != len(model.Instances()) {
				t.Fatalf("%d MIG devices on GPU 0, want one per instance of the model: %d", len(names), len(model.Instances()))
			}
			sets := 0
			var walk func(held []string, from int)
			walk = func(held []string, from int) {
				sets++
				instances := make([]mig.Instance, 0, len(held)+1)
				for _, h := range held {
					instances = append(instances, instance[h])
				}
				for _, name := range names {
					counters := m.fits(append(held[:len(held):len(held)], name))
					coexist := model.Coexist(append(instances[:len(instances):len(instances)], instance[name])) == nil
					if counters != coexist {
						t.Fatalf("holding %v, adding %s: counters allow it %v, mig.Coexist %v", held, name, counters, coexist)
					}
				}
				if whole := m.fits(append(held[:len(held):len(held)], "g0-1x")); whole != (len(held) == 0) {
					t.Fatalf("holding %v: the whole GPU's 1x group fits %v", held, whole)
				}
				for i := from; i < len(names); i++ {
					next := append(slices.Clone(held), names[i])
					if m.fits(next) {
						walk(next, i+1)
					}
				}
			}
			walk(nil, 0)
			t.Logf("%s: %d sets of instances checked", tc.model, sets)
		})
	}
}

// The shape of a node offering every MIG profile of its model on every GPU
// beside the 1x…8x profiles, measured and held to the API's limits
// (k8s.io/api/resource/v1, 1.37). The figures go to docs/design.md.
func TestMIGShapeWithinAPILimits(t *testing.T) {
	for _, tc := range []struct{ preset, model string }{{"dgx-h100", "H100-80GB"}, {"dgx-a100", "A100-40GB"}, {"dgx-h200", "H200"}} {
		t.Run(tc.preset, func(t *testing.T) {
			model := presetModel(t, tc.preset)
			n := newNode(t, tc.preset, everyMIGProfile(model), draresources.LayoutShared)
			res := draresources.Resources(n.plan, n.inv, "node-1", draresources.LayoutShared)
			var devices, migDevices, deviceSlices, counterSlices, sets, counters int
			var maxDevices, maxSets, maxSetCounters, maxConsumptions, maxConsumed, maxFields, maxSliceConsumed int
			for i, s := range res.Pools["node-1"].Slices {
				if s.Devices != nil && s.SharedCounters != nil {
					t.Errorf("slice %d has devices and counters", i)
				}
				if len(s.SharedCounters) > 0 {
					counterSlices++
				}
				if len(s.Devices) > 0 {
					deviceSlices++
				}
				sets += len(s.SharedCounters)
				maxSets = max(maxSets, len(s.SharedCounters))
				for _, cs := range s.SharedCounters {
					counters += len(cs.Counters)
					maxSetCounters = max(maxSetCounters, len(cs.Counters))
				}
				maxDevices = max(maxDevices, len(s.Devices))
				sliceConsumed := 0
				for _, d := range s.Devices {
					devices++
					if _, ok := d.Attributes[draresources.AttrMIGProfile]; ok {
						migDevices++
					}
					maxConsumptions = max(maxConsumptions, len(d.ConsumesCounters))
					for _, cc := range d.ConsumesCounters {
						maxConsumed = max(maxConsumed, len(cc.Counters))
						sliceConsumed += len(cc.Counters)
					}
					maxFields = max(maxFields, len(d.Attributes)+len(d.Capacity))
				}
				maxSliceConsumed = max(maxSliceConsumed, sliceConsumed)
			}
			t.Logf("%s (%s): %d devices (%d MIG, %d groups) in %d device slices (at most %d per slice, %d counters consumed in one); "+
				"%d counters in %d sets in %d counter slices (at most %d sets per slice, %d counters per set); "+
				"a device consumes from at most %d sets, at most %d counters from one, and has at most %d attributes and capacities",
				tc.preset, tc.model, devices, migDevices, devices-migDevices, deviceSlices, maxDevices, maxSliceConsumed,
				counters, sets, counterSlices, maxSets, maxSetCounters, maxConsumptions, maxConsumed, maxFields)
			if want := 8*len(model.Instances()) + 15; devices != want || migDevices != 8*len(model.Instances()) {
				t.Errorf("%d devices, %d of them MIG; want %d, %d", devices, migDevices, want, 8*len(model.Instances()))
			}
			for _, c := range []struct {
				what       string
				got, limit int
			}{
				{"devices per slice", maxDevices, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures},
				{"counter sets per slice", maxSets, resourceapi.ResourceSliceMaxCounterSets},
				{"counters per set", maxSetCounters, resourceapi.ResourceSliceMaxCountersPerCounterSet},
				{"counter consumptions per device", maxConsumptions, resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice},
				{"counters per consumption", maxConsumed, resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption},
				{"attributes and capacities per device", maxFields, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice},
			} {
				if c.got > c.limit {
					t.Errorf("%s: %d, limit %d", c.what, c.got, c.limit)
				}
			}
			// The real allocator over the whole shape: one 7g instance per
			// GPU, then nothing else.
			full := "mig-" + model.Profiles[len(model.Profiles)-1].Name + ".kyb.ai"
			if got := n.fill(t, full); len(got) != 8 {
				t.Errorf("%d %s seats fit, want 8: %v", len(got), full, got)
			}
			for _, p := range model.Profiles {
				class := "mig-" + strings.ReplaceAll(p.Name, "+", "-") + ".kyb.ai"
				if r := n.allocate(t, "more-"+class, class); r != nil {
					t.Errorf("%s fit on a node whose GPUs each hold a 7g instance: %+v", class, r.Devices.Results)
				}
			}
			if r := n.allocate(t, "whole", class1x); r != nil {
				t.Errorf("a 1x seat fit beside eight 7g instances: %+v", r.Devices.Results)
			}
		})
	}
}
