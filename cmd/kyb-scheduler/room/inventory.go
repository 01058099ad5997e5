package room

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// inventory is what a node's slices publish, as far as the allocator's
// accounting goes: each device's capacities and the counters it
// consumes, and each counter's total. Not which device a request may
// take: that is the allocator's, which the search asks.
type inventory struct {
	devices  map[structured.DeviceID]*deviceInfo
	counters map[counterKey]resource.Quantity
}

type deviceInfo struct {
	// shared devices take many allocations (allowMultipleAllocations),
	// each a share of the capacity.
	shared   bool
	capacity map[resourceapi.QualifiedName]resource.Quantity
	consumes []counterUse
}

// counterKey names a counter of a pool's counter set.
type counterKey struct {
	driver, pool, set, counter string
}

type counterUse struct {
	key    counterKey
	amount resource.Quantity
}

// nodeInventory reads the slices of a node's own pools (those that name
// it). Devices of pools that many nodes share (network-attached) are not
// in it: their holders are not preemption's to find, so the search only
// finds a pod room on them where the allocator does so anyway.
func nodeInventory(slices []*resourceapi.ResourceSlice, node string) *inventory {
	inv := &inventory{devices: map[structured.DeviceID]*deviceInfo{}, counters: map[counterKey]resource.Quantity{}}
	for _, s := range slices {
		if ptr.Deref(s.Spec.NodeName, "") != node {
			continue
		}
		driver, pool := s.Spec.Driver, s.Spec.Pool.Name
		for _, set := range s.Spec.SharedCounters {
			for name, c := range set.Counters {
				inv.counters[counterKey{driver, pool, set.Name, name}] = c.Value
			}
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			info := &deviceInfo{shared: ptr.Deref(d.AllowMultipleAllocations, false), capacity: map[resourceapi.QualifiedName]resource.Quantity{}}
			for name, c := range d.Capacity {
				info.capacity[name] = c.Value
			}
			for _, use := range d.ConsumesCounters {
				for name, c := range use.Counters {
					info.consumes = append(info.consumes, counterUse{key: counterKey{driver, pool, use.CounterSet, name}, amount: c.Value})
				}
			}
			inv.devices[structured.MakeDeviceID(driver, pool, d.Name)] = info
		}
	}
	return inv
}
