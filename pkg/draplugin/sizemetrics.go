package draplugin

import (
	"github.com/prometheus/client_golang/prometheus"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// A sized group's memory and compute by state, as kyb_seats counts its
// seats: held is what the prepared claims' sized seats hold, the rest is
// free, blocked or unhealthy as the group's free seats are. Each sums over
// states to what the group publishes.
var (
	seatMemoryDesc = prometheus.NewDesc("kyb_seat_memory_bytes",
		"Device memory of the node's sized groups, per GPU of the group, by state: held (by the sized seats of prepared claims), free, blocked (a group sharing a GPU is in use), unhealthy (a GPU of the group is tainted). A group's memory sums to what it publishes; a claim also needs a free seat (kyb_seats).",
		[]string{"profile", "group", "state"}, nil)
	seatComputeDesc = prometheus.NewDesc("kyb_seat_compute_ratio",
		"SMs of the node's sized groups, as a share of each GPU's (0-1), by state as kyb_seat_memory_bytes. A group's compute sums to 1.",
		[]string{"profile", "group", "state"}, nil)
)

// preparedClaims are the claims whose prepare completed
// (seatledger.Ledger).
type preparedClaims interface {
	Prepared() []*checkpoint.Claim
}

// sizeCollector computes kyb_seat_memory_bytes and kyb_seat_compute_ratio
// at each scrape from the prepared claims' sizes and the publisher's view
// of the groups' health.
type sizeCollector struct {
	p      *publisher
	ledger preparedClaims
}

func (c sizeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- seatMemoryDesc
	ch <- seatComputeDesc
}

func (c sizeCollector) Collect(ch chan<- prometheus.Metric) {
	held := map[string]v1alpha1.SeatSize{}
	fenced := map[string]bool{}
	for _, cl := range c.ledger.Prepared() {
		for _, d := range cl.Devices {
			switch {
			case d.Fenced:
				fenced[d.GroupDevice] = true
			case d.Size != nil:
				held[d.GroupDevice] = held[d.GroupDevice].Add(*d.Size)
			}
		}
	}
	_, rest := c.p.seatStates()
	for _, g := range c.p.node.Plan.Groups() {
		sizes, sized := g.Sizes()
		if !sized {
			continue
		}
		h := held[g.DeviceName()]
		if fenced[g.DeviceName()] {
			// A claim whose seats are not known holds the whole group.
			h = v1alpha1.SeatSize{MemoryBytes: sizes.Memory.Capacity, ComputePercent: sizes.Compute.Capacity}
		}
		serve := func(desc *prometheus.Desc, capacity, held int64, unit float64) {
			held = min(held, capacity)
			values := map[string]int64{seatHeld: held, seatFree: 0, seatBlocked: 0, seatUnhealthy: 0}
			values[rest(g)] += capacity - held
			for _, state := range seatStateNames {
				ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(values[state])/unit, g.Profile.Name, g.Name, state)
			}
		}
		serve(seatMemoryDesc, sizes.Memory.Capacity, h.MemoryBytes, 1)
		serve(seatComputeDesc, sizes.Compute.Capacity, h.ComputePercent, v1alpha1.MaxCompute)
	}
}
