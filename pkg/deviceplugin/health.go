package deviceplugin

import (
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// HealthSource tells the shim which GPUs are unhealthy and when that
// changes. The GPU health monitor implements it; without one, every GPU is
// healthy. It has the shape of the DRA plugin's HealthSource, so one
// monitor serves both surfaces; it is declared here again so that the shim
// does not depend on the DRA plugin.
type HealthSource interface {
	// Unhealthy maps the index of every unhealthy GPU to the reason.
	Unhealthy() map[int]string
	// Subscribe returns a channel that receives after every change, and a
	// function that ends the subscription.
	Subscribe() (<-chan struct{}, func())
}

type healthView struct {
	src HealthSource
}

// subscribe returns a change channel (nil, which never receives, without a
// source) and the function that ends the subscription.
func (h healthView) subscribe() (<-chan struct{}, func()) {
	if h.src == nil {
		return nil, func() {}
	}
	return h.src.Subscribe()
}

// unhealthy returns the unhealthy GPUs (nil without a source).
func (h healthView) unhealthy() map[int]string {
	if h.src == nil {
		return nil
	}
	return h.src.Unhealthy()
}

// groupHealth is the kubelet's health value for every seat of g: a seat is
// unhealthy when any GPU of its group is, since its container would see
// that GPU.
func groupHealth(g *planner.Group, bad map[int]string) string {
	for _, x := range g.GPUs {
		if _, ok := bad[x]; ok {
			return pluginapi.Unhealthy
		}
	}
	return pluginapi.Healthy
}
