package health

import (
	"fmt"
	"slices"
	"strings"
)

// Source tells which GPUs are unhealthy and when that changes. The Monitor
// implements it; the DRA plugin and the device-plugin shim both read it,
// so one monitor serves either surface.
type Source interface {
	// Faults maps the index of every unhealthy GPU to its fault.
	Faults() map[int]Fault
	// Subscribe returns a channel that receives after every change, and a
	// function that ends the subscription.
	Subscribe() (<-chan struct{}, func())
}

// View reads a Source that may be absent: without one, every GPU is
// healthy and nothing changes.
type View struct {
	Source Source
}

// Faults are the unhealthy GPUs (none without a source).
func (v View) Faults() map[int]Fault {
	if v.Source == nil {
		return nil
	}
	return v.Source.Faults()
}

// Subscribe returns a change channel (nil, which never receives, without a
// source) and the function that ends the subscription.
func (v View) Subscribe() (<-chan struct{}, func()) {
	if v.Source == nil {
		return nil, func() {}
	}
	return v.Source.Subscribe()
}

// OfGPUs reports whether all of gpus are healthy and, if not, which are
// not and why, in GPU order: a group or a seat is as healthy as its least
// healthy GPU, since its container sees every one of them.
func OfGPUs(gpus []int, faults map[int]Fault) (bool, string) {
	var msgs []string
	for _, x := range slices.Sorted(slices.Values(gpus)) {
		if f, ok := faults[x]; ok {
			msgs = append(msgs, fmt.Sprintf("GPU %d: %s", x, f.Message))
		}
	}
	if len(msgs) == 0 {
		return true, ""
	}
	return false, strings.Join(msgs, "; ")
}
