package placement

import (
	"fmt"
	"strconv"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// BenchmarkDeviceOrderOfALargePool is the device order of one node's pool
// of n devices (order.go), made anew as when the node's slices or
// allocations change: a node publishing the groups of 1, 2, 4 and 8 GPUs
// of 32 GPUs over and over, under new names, in slices of 64 devices, as
// a node that publishes many slices in its own pool can, with the groups
// of GPUs 0 to 7 of its first copy in use.
func BenchmarkDeviceOrderOfALargePool(b *testing.B) {
	for _, n := range []int{2048, 8192, 32768} {
		b.Run(fmt.Sprintf("devices=%d", n), func(b *testing.B) {
			p := parsePool("node-a", repeatedGroups("node-a", n, 32))
			var a allocs
			a.reset(len(p.devices))
			for i, d := range p.devices[:60] {
				a.inUse[i] = d.size == 1 && d.gpus.bound() <= 8
			}
			s := &scratch{}
			for b.Loop() {
				p.reorder(&a, s)
			}
		})
	}
}

// repeatedGroups are the slices of node's pool of n devices: the groups
// of 1, 2, 4 and 8 GPUs of a node of gpus GPUs, each consuming its GPUs'
// counters, repeated under new names until there are n, 64 to a slice
// after the slice of counters.
func repeatedGroups(node string, n, gpus int) []*resourceapi.ResourceSlice {
	one := resourceapi.Counter{Value: resource.MustParse("1")}
	counters := map[string]resourceapi.Counter{}
	for g := range gpus {
		counters[counterPrefix+strconv.Itoa(g)] = one
	}
	slice := func() *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver.Name,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1},
		}}
	}
	out := []*resourceapi.ResourceSlice{slice()}
	out[0].Spec.SharedCounters = []resourceapi.CounterSet{{Name: counterSet, Counters: counters}}
	var cur *resourceapi.ResourceSlice
	for i := 0; i < n; {
		for _, size := range []int{1, 2, 4, 8} {
			for first := 0; first+size <= gpus && i < n; first += size {
				if cur == nil || len(cur.Spec.Devices) == 64 {
					cur = slice()
					out = append(out, cur)
				}
				consumed := map[string]resourceapi.Counter{}
				for g := first; g < first+size; g++ {
					consumed[counterPrefix+strconv.Itoa(g)] = one
				}
				cur.Spec.Devices = append(cur.Spec.Devices, resourceapi.Device{
					Name: fmt.Sprintf("c%d-g%d-%dx", i, first, size),
					Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
						resourceapi.QualifiedName(v1alpha1.AttrProfile): {StringValue: ptr.To(strconv.Itoa(size) + "x")},
					},
					Capacity:         map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{seatsCapacity: {Value: one.Value}},
					ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: counterSet, Counters: consumed}},
				})
				i++
			}
		}
	}
	for i, s := range out {
		s.Name = fmt.Sprintf("%s-%05d", node, i)
		s.Spec.Pool.ResourceSliceCount = int64(len(out))
	}
	return out
}
