package draplugin

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// The states kyb_seats counts a group's seats in.
const (
	seatHeld      = "held"
	seatFree      = "free"
	seatBlocked   = "blocked"
	seatUnhealthy = "unhealthy"
)

// seatsDesc is kyb_seats: the node's seats per profile, group and state.
// Every seat of every group is in exactly one state, so the sum over
// states is the group's seats.
var seatsDesc = prometheus.NewDesc("kyb_seats",
	"Seats of the node's groups by state: held (by a prepared claim), free, blocked (a group sharing a GPU is in use), unhealthy (a GPU of the group is tainted). A group's seats sum to its size.",
	[]string{"profile", "group", "state"}, nil)

// seatCollector computes kyb_seats at each scrape from what the publisher
// knows: the seats held, and the health of the GPUs.
type seatCollector struct{ p *publisher }

func (c seatCollector) Describe(ch chan<- *prometheus.Desc) { ch <- seatsDesc }

func (c seatCollector) Collect(ch chan<- prometheus.Metric) {
	held, rest := c.p.seatStates()
	for _, g := range c.p.node.Plan.Groups() {
		n := g.Seats()
		h := min(held[g.DeviceName()], n)
		counts := map[string]int{seatHeld: h, seatFree: 0, seatBlocked: 0, seatUnhealthy: 0}
		counts[rest(g)] += n - h
		for _, state := range seatStateNames {
			ch <- prometheus.MustNewConstMetric(seatsDesc, prometheus.GaugeValue, float64(counts[state]), g.Profile.Name, g.Name, state)
		}
	}
}

// seatStateNames are the states, in the order they are served.
var seatStateNames = []string{seatHeld, seatFree, seatBlocked, seatUnhealthy}

// seatStates are the seats held per group device now, and the state of a
// group's seats that are not held: unhealthy where a GPU of the group is
// tainted, else blocked where a group sharing a GPU is in use, else free.
func (p *publisher) seatStates() (draresources.Held, func(*planner.Group) string) {
	p.mu.Lock()
	held := maps.Clone(p.usage.Held)
	p.mu.Unlock()
	faults := p.health.taints()
	blocked := draresources.Blocked(p.node.Plan, held.Devices())
	return held, func(g *planner.Group) string {
		switch {
		case slices.ContainsFunc(g.GPUs, func(x int) bool { _, bad := faults[x]; return bad }):
			return seatUnhealthy
		case blocked[g.DeviceName()]:
			return seatBlocked
		}
		return seatFree
	}
}
