package draplugin

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// HealthSource tells the plugin which GPUs are unhealthy and when that
// changes. The GPU health monitor implements it; without one, every GPU is
// healthy.
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

// groupHealth reports whether all GPUs of a group are healthy, and if not,
// which are not and why.
func (h healthView) groupHealth(g *planner.Group) (bool, string) {
	if h.src == nil {
		return true, ""
	}
	bad := h.src.Unhealthy()
	var msgs []string
	for _, x := range g.GPUs {
		if reason, ok := bad[x]; ok {
			msgs = append(msgs, fmt.Sprintf("GPU %d: %s", x, reason))
		}
	}
	if len(msgs) == 0 {
		return true, ""
	}
	slices.Sort(msgs)
	return false, strings.Join(msgs, "; ")
}
