package placement

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// A GPU index is read from names and attributes a slice publishes; one
// beyond any node's GPUs is not a GPU of the driver's, and a set sized by
// it would let one slice take the scheduler's memory (gpu9000000000000000
// is a valid counter name).
func TestGPUIndicesBeyondAnyNodeAreNotGPUs(t *testing.T) {
	one := resourceapi.Counter{Value: resource.MustParse("1")}
	for _, tc := range []struct {
		name     string
		device   resourceapi.Device
		wantSize int
	}{
		{name: "counters", wantSize: 1, device: resourceapi.Device{Name: "g0", ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
			CounterSet: counterSet, Counters: map[string]resourceapi.Counter{"gpu1": one, "gpu67108864": one},
		}}}},
		{name: "gpuIndices", wantSize: 1, device: resourceapi.Device{Name: "g0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"gpuIndices": {StringValue: ptr.To("1,67108864")},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := parseDevice(&tc.device)
			if d.size != tc.wantSize || len(d.gpus) > 1 || d.gpus.bound() != 2 {
				t.Errorf("parsed %d GPUs in a set of %d words, bound %d: want GPU 1 alone", d.size, len(d.gpus), d.gpus.bound())
			}
		})
	}
}
