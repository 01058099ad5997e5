package placement

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"slices"
	"time"
)

// Result is what one policy did with one request stream.
type Result struct {
	Policy string
	// Utilization is the time-weighted share of GPUs busy.
	Utilization float64
	// Fragmentation is the time-weighted share of free GPUs that no
	// request for a 4-GPU group could use: free GPUs outside every fully
	// free 4-GPU topology group.
	Fragmentation float64
	// Rejection is the share of requests that fit nowhere on arrival
	// (they are dropped, not queued).
	Rejection float64
	// Misaligned is the share of placed multi-GPU requests whose GPUs are
	// not one topology group (split across islands or switches).
	Misaligned float64
	// Wait is the mean time a request waited for its batch (bin-packing).
	Wait float64
	// MeanPlace and P99Place time the policy's decision, rejects included.
	MeanPlace, P99Place time.Duration
	Placed, Rejected    int
	// RejectedWithRoom counts the rejects made while some node had a whole
	// free topology group of the request's size: none for a policy that
	// sees the cluster as it is (the real-scheduler rows check that their
	// scheduler did).
	RejectedWithRoom int
	// StaleRejects counts the requests a real scheduler first found
	// unschedulable and then placed on its retry, once it had seen the
	// releases before them (sched.go), over the whole stream, warm-up
	// included.
	StaleRejects int
	// AdmittedLarge and RejectedLarge count the placed and rejected
	// requests of four GPUs or more;
	// Evictions, the pods a defragmenting scheduler evicted for the
	// counted requests (defrag.go); Lost, the moved pods whose
	// replacement was placed nowhere, over the whole stream.
	AdmittedLarge, RejectedLarge, Evictions, Lost int
	// RejectedFree counts the rejects made while the cluster had at
	// least the request's number of GPUs free: where only the shape of
	// what was free stood in the way, which moving pods may mend.
	RejectedFree int
	// RequestedGPUs and RejectedGPUs sum the GPUs of the counted
	// requests and of those rejected: a policy that admits large requests
	// at the cost of small ones rejects more requests, and fewer GPUs.
	RequestedGPUs, RejectedGPUs int
}

// evictor is a policy whose scheduler may evict pods to place one.
type evictor interface {
	Evictions() int
	Lost() int
}

// syncer is a policy that must catch up with the releases before a
// placement, outside the placement's time (sched.go).
type syncer interface {
	Sync(ctx context.Context) error
}

// Simulate replays reqs (ordered by arrival) with policy p over nodes,
// which must be fresh. The first warmup share of requests fills the
// cluster and is left out of every figure; the measurement ends at the
// last arrival.
func Simulate(ctx context.Context, p Policy, nodes []*Node, reqs []Request, warmup float64) (Result, error) {
	if len(reqs) == 0 {
		return Result{}, fmt.Errorf("no requests")
	}
	s := &state{nodes: nodes, start: reqs[int(float64(len(reqs))*warmup)].Arrival, end: reqs[len(reqs)-1].Arrival}
	for _, n := range nodes {
		s.gpus += n.GPUs()
	}
	res := Result{Policy: p.Name()}
	var took []time.Duration
	var waits []float64
	placedMulti, misaligned := 0, 0
	place := func(r Request, at float64) error {
		measured := r.Arrival >= s.start
		if sy, ok := p.(syncer); ok {
			if err := sy.Sync(ctx); err != nil {
				return fmt.Errorf("%s: before request %d: %w", p.Name(), r.ID, err)
			}
		}
		ev, _ := p.(evictor)
		evicted := 0
		if ev != nil {
			evicted = ev.Evictions()
		}
		t0 := time.Now()
		pl, err := p.Place(ctx, r)
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("%s: request %d: %w", p.Name(), r.ID, err)
		}
		if ev != nil && measured {
			res.Evictions += ev.Evictions() - evicted
		}
		if measured {
			took = append(took, d)
			res.RequestedGPUs += r.Size
		}
		if pl == nil {
			if measured {
				res.Rejected++
				res.RejectedGPUs += r.Size
				if r.Size >= 4 {
					res.RejectedLarge++
				}
				free := 0
				for _, n := range s.nodes {
					free += n.Free()
				}
				if free >= r.Size {
					res.RejectedFree++
				}
				if slices.ContainsFunc(s.nodes, func(n *Node) bool { return len(n.freeGroups(r.Size)) > 0 }) {
					res.RejectedWithRoom++
				}
			}
			return nil
		}
		if err := pl.Node.take(pl.GPUs); err != nil {
			return fmt.Errorf("%s: request %d: %w", p.Name(), r.ID, err)
		}
		heap.Push(&s.running, running{end: at + r.Duration, p: pl})
		if measured {
			res.Placed++
			if r.Size >= 4 {
				res.AdmittedLarge++
			}
			waits = append(waits, at-r.Arrival)
			if r.Size > 1 {
				placedMulti++
				if !pl.Aligned {
					misaligned++
				}
			}
		}
		return nil
	}
	if w := p.Batch(); w > 0 {
		for i := 0; i < len(reqs); {
			window := int(reqs[i].Arrival / w)
			j := i
			for j < len(reqs) && int(reqs[j].Arrival/w) == window {
				j++
			}
			at := float64(window+1) * w
			if err := s.advance(at); err != nil {
				return res, fmt.Errorf("%s: %w", p.Name(), err)
			}
			batch := slices.Clone(reqs[i:j])
			slices.SortStableFunc(batch, func(a, b Request) int { return cmp.Compare(b.Size, a.Size) })
			for _, r := range batch {
				if err := place(r, at); err != nil {
					return res, err
				}
			}
			i = j
		}
	} else {
		for _, r := range reqs {
			if err := s.advance(r.Arrival); err != nil {
				return res, fmt.Errorf("%s: %w", p.Name(), err)
			}
			if err := place(r, r.Arrival); err != nil {
				return res, err
			}
		}
	}
	if err := s.advance(s.end); err != nil {
		return res, fmt.Errorf("%s: %w", p.Name(), err)
	}
	span := s.end - s.start
	if span > 0 {
		res.Utilization = s.busyInt / (span * float64(s.gpus))
	}
	if s.fragTime > 0 {
		res.Fragmentation = s.fragInt / s.fragTime
	}
	if n := res.Placed + res.Rejected; n > 0 {
		res.Rejection = float64(res.Rejected) / float64(n)
	}
	if placedMulti > 0 {
		res.Misaligned = float64(misaligned) / float64(placedMulti)
	}
	if sr, ok := p.(interface{ StaleRejects() int }); ok {
		res.StaleRejects = sr.StaleRejects()
	}
	if ev, ok := p.(evictor); ok {
		res.Lost = ev.Lost()
	}
	for _, w := range waits {
		res.Wait += w / float64(len(waits))
	}
	if len(took) > 0 {
		var sum time.Duration
		for _, d := range took {
			sum += d
		}
		res.MeanPlace = sum / time.Duration(len(took))
		slices.Sort(took)
		res.P99Place = took[min(len(took)-1, len(took)*99/100)]
	}
	return res, nil
}

type running struct {
	end float64
	p   *Placement
}

type runningHeap []running

func (h runningHeap) Len() int           { return len(h) }
func (h runningHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h runningHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *runningHeap) Push(x any)        { *h = append(*h, x.(running)) }
func (h *runningHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// state is the cluster over time and the integrals the figures come from.
type state struct {
	nodes      []*Node
	gpus       int
	running    runningHeap
	now        float64
	start, end float64
	busyInt    float64
	fragInt    float64
	fragTime   float64
}

// advance releases what ends by t, accumulating the integrals up to t.
func (s *state) advance(t float64) error {
	for s.running.Len() > 0 && s.running[0].end <= t {
		r := heap.Pop(&s.running).(running)
		s.accumulate(r.end)
		r.p.Node.release(r.p.GPUs)
		if r.p.release != nil {
			if err := r.p.release(); err != nil {
				return fmt.Errorf("release from node %s: %w", r.p.Node.Name, err)
			}
		}
	}
	s.accumulate(t)
	return nil
}

// accumulate adds the current state's share of [now, t] that falls in the
// measured window.
func (s *state) accumulate(t float64) {
	lo, hi := max(s.now, s.start), min(t, s.end)
	if t > s.now {
		s.now = t
	}
	dt := hi - lo
	if dt <= 0 {
		return
	}
	free, stranded := 0, 0
	for _, n := range s.nodes {
		free += n.Free()
		stranded += n.stranded(4)
	}
	s.busyInt += dt * float64(s.gpus-free)
	if free > 0 {
		s.fragInt += dt * float64(stranded) / float64(free)
		s.fragTime += dt
	}
}
