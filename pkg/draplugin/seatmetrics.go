package draplugin

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
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
	p := c.p
	p.mu.Lock()
	held := maps.Clone(p.usage.Held)
	p.mu.Unlock()
	faults := p.health.taints()
	blocked := draresources.Blocked(p.node.Plan, held.Devices())
	for _, g := range p.node.Plan.Groups() {
		n := g.Seats()
		h := min(held[g.DeviceName()], n)
		rest := seatFree
		switch {
		case slices.ContainsFunc(g.GPUs, func(x int) bool { _, bad := faults[x]; return bad }):
			rest = seatUnhealthy
		case blocked[g.DeviceName()]:
			rest = seatBlocked
		}
		counts := map[string]int{seatHeld: h, seatFree: 0, seatBlocked: 0, seatUnhealthy: 0}
		counts[rest] += n - h
		for _, state := range []string{seatHeld, seatFree, seatBlocked, seatUnhealthy} {
			ch <- prometheus.MustNewConstMetric(seatsDesc, prometheus.GaugeValue, float64(counts[state]), g.Profile.Name, g.Name, state)
		}
	}
}
