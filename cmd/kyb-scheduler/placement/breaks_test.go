package placement

import (
	"math/rand/v2"
	"testing"
)

// breaksByScan is the count of the idle larger groups device i breaks as
// the device order made it before the index: every device of the pool
// asked, for every device.
func breaksByScan(p *pool, i int, busy gpuSet) int {
	d := p.devices[i]
	n := 0
	for _, big := range p.devices {
		if big.exclusive && !big.tainted && big.size > d.size && big.gpus.overlaps(d.gpus) && !busy.overlaps(big.gpus) {
			n++
		}
	}
	return n
}

// The index counts, for every device of a random pool, what asking every
// device counts: pools of groups of any GPUs (indices past 63 included,
// sets of several words), exclusive or not, tainted or not, some of their
// GPUs busy, devices of one GPU set repeated.
func TestBrokenGroupsAreCountedAsByAScanOfThePool(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	var x breakIndex
	var out []int
	for round := range 300 {
		gpus := 1 + rng.IntN(100)
		p := &pool{gpus: gpus}
		var sets []gpuSet
		for range rng.IntN(200) {
			var set gpuSet
			if len(sets) > 0 && rng.IntN(3) == 0 {
				set = append(gpuSet(nil), sets[rng.IntN(len(sets))]...)
			} else {
				for range rng.IntN(min(gpus, 9)) {
					set.add(rng.IntN(gpus))
				}
			}
			sets = append(sets, set)
			p.devices = append(p.devices, &device{gpus: set, size: set.count(), exclusive: rng.IntN(4) > 0, tainted: rng.IntN(8) == 0})
		}
		var busy gpuSet
		for range rng.IntN(4) {
			busy.add(rng.IntN(gpus))
		}
		out = x.count(p, busy, out)
		for i := range p.devices {
			if want := breaksByScan(p, i, busy); out[i] != want {
				t.Fatalf("round %d: device %d (GPUs %v) breaks %d groups by the index, %d by a scan", round, i, p.devices[i].gpus, out[i], want)
			}
		}
	}
}

// The order's work grows with the pool, not with its square: sixteen
// times the devices of one node (the groups of 32 GPUs published again
// and again under new names) take at most sixteen times the steps (the
// index's words read).
func TestDeviceOrderWorkGrowsWithThePool(t *testing.T) {
	visits := map[int]int{}
	for _, n := range []int{2048, 32768} {
		p := parsePool("node-a", repeatedGroups("node-a", n, 32))
		var a allocs
		a.reset(len(p.devices))
		for i, d := range p.devices[:60] {
			a.inUse[i] = d.size == 1 && d.gpus.bound() <= 8
		}
		s := &scratch{}
		o := p.reorder(&a, s)
		if len(o.order) != n {
			t.Fatalf("%d devices ordered of %d", len(o.order), n)
		}
		visits[n] = s.breaks.visits
	}
	t.Logf("steps: %v", visits)
	if visits[32768] > 16*visits[2048] {
		t.Errorf("ordering 32,768 devices took %d steps, 2,048 devices %d: %.1f times for 16 times the devices", visits[32768], visits[2048], float64(visits[32768])/float64(visits[2048]))
	}
}
