package draplugin

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// HealthSource tells the plugin which GPUs are unhealthy and when that
// changes. The GPU health monitor (package health) implements it; without
// one, every GPU is healthy. The device-plugin shim's HealthSource asks
// for messages only; the plugin needs the faults themselves, since a lost
// GPU may taint with another effect.
type HealthSource interface {
	// Faults maps the index of every unhealthy GPU to its fault.
	Faults() map[int]health.Fault
	// Subscribe returns a channel that receives after every change, and a
	// function that ends the subscription.
	Subscribe() (<-chan struct{}, func())
}

type healthView struct {
	src HealthSource
	// lostEffect is the taint effect of a lost GPU.
	lostEffect resourceapi.DeviceTaintEffect
}

// subscribe returns a change channel (nil, which never receives, without a
// source) and the function that ends the subscription.
func (h healthView) subscribe() (<-chan struct{}, func()) {
	if h.src == nil {
		return nil, func() {}
	}
	return h.src.Subscribe()
}

// faults are the unhealthy GPUs (none without a source).
func (h healthView) faults() map[int]health.Fault {
	if h.src == nil {
		return nil
	}
	return h.src.Faults()
}

// groupHealthOf reports whether all GPUs of a group are healthy, and if
// not, which are not and why.
func groupHealthOf(g *planner.Group, bad map[int]health.Fault) (bool, string) {
	var msgs []string
	for _, x := range g.GPUs {
		if f, ok := bad[x]; ok {
			msgs = append(msgs, fmt.Sprintf("GPU %d: %s", x, f.Message))
		}
	}
	if len(msgs) == 0 {
		return true, ""
	}
	slices.Sort(msgs)
	return false, strings.Join(msgs, "; ")
}

// taints says how each unhealthy GPU taints the devices of its groups:
// NoSchedule, or the configured effect for a lost GPU. NoSchedule leaves
// running pods alone: a pod that saw one XID may well finish, and
// evicting it is the operator's choice (health.gpuLostEffect: NoExecute
// for GPUs that are gone for good).
func taintsOf(bad map[int]health.Fault, lostEffect resourceapi.DeviceTaintEffect) draresources.Faults {
	if len(bad) == 0 {
		return nil
	}
	out := draresources.Faults{}
	for x, f := range bad {
		effect := resourceapi.DeviceTaintEffectNoSchedule
		if f.Kind == health.KindLost && lostEffect != "" {
			effect = lostEffect
		}
		out[x] = draresources.Fault{Reason: f.Reason, Effect: effect}
	}
	return out
}
