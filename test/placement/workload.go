// Package placement is a seat placement simulator: it replays a seeded
// stream of seat requests and releases over simulated nodes and measures
// how placement policies use the GPUs. The classic policies of the seed
// design (first-fit, best-fit, worst-fit, bin-packing, spread,
// topology-aware) place on a model of each node's GPUs; the DRA policies
// place with the scheduler's real allocator over the ResourceSlices the
// plugin publishes, in pack and in spread device order; the sched-stock and
// kyb-* policies place through a real scheduler (kube-scheduler, and the
// kyb-scheduler binary under each of its policies) on a control plane whose
// nodes publish the same slices. kyb-sim runs it.
package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Request is one seat request: Size GPUs from Arrival for Duration.
type Request struct {
	ID       int
	Size     int
	Arrival  float64
	Duration float64
}

// Mix is the share of requests of each size.
type Mix map[int]float64

// ParseMix reads "1x:0.6,2x:0.3,4x:0.1".
func ParseMix(s string) (Mix, error) {
	m := Mix{}
	total := 0.0
	for _, part := range strings.Split(s, ",") {
		name, share, ok := strings.Cut(strings.TrimSpace(part), ":")
		size, err := strconv.Atoi(strings.TrimSuffix(name, "x"))
		if !ok || err != nil || !slices.Contains([]int{1, 2, 4, 8}, size) {
			return nil, fmt.Errorf("mix %q: %q is not <1x|2x|4x|8x>:<share>", s, part)
		}
		f, err := strconv.ParseFloat(share, 64)
		if err != nil || f < 0 {
			return nil, fmt.Errorf("mix %q: share %q is not a non-negative number", s, share)
		}
		m[size] += f
		total += f
	}
	if total <= 0 {
		return nil, fmt.Errorf("mix %q: the shares add up to nothing", s)
	}
	for k := range m {
		m[k] /= total
	}
	return m, nil
}

// Sizes returns the sizes in ascending order.
func (m Mix) Sizes() []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Mean is the mean request size in GPUs.
func (m Mix) Mean() float64 {
	s := 0.0
	for k, f := range m {
		s += float64(k) * f
	}
	return s
}

// Distributions draw positive numbers with a given mean.
var Distributions = []string{"exp", "uniform", "lognormal", "pareto", "const"}

// draw returns a sample of the named distribution with the given mean.
func draw(r *rand.Rand, dist string, mean float64) (float64, error) {
	switch dist {
	case "exp":
		return r.ExpFloat64() * mean, nil
	case "uniform":
		return r.Float64() * 2 * mean, nil
	case "lognormal":
		// sigma 1: heavy enough to matter, mean kept at mean.
		const sigma = 1.0
		return math.Exp(math.Log(mean) - sigma*sigma/2 + sigma*r.NormFloat64()), nil
	case "pareto":
		// Shape 1.5: a heavy tail with a finite mean.
		const alpha = 1.5
		xm := mean * (alpha - 1) / alpha
		return xm / math.Pow(1-r.Float64(), 1/alpha), nil
	case "const":
		return mean, nil
	}
	return 0, fmt.Errorf("unknown distribution %q (known: %s)", dist, strings.Join(Distributions, ", "))
}

// Workload describes the request stream.
type Workload struct {
	Seed     uint64
	Requests int
	Mix      Mix
	// Arrival and Duration name the distributions of inter-arrival times
	// and of durations.
	Arrival, Duration string
	// MeanDuration is the mean duration; the arrival rate follows from the
	// offered load.
	MeanDuration float64
	// Load is the offered load: the GPUs requests would keep busy if none
	// were rejected, as a share of the cluster's GPUs.
	Load float64
}

// Generate draws the requests, ordered by arrival, for a cluster of gpus
// GPUs.
func (w Workload) Generate(gpus int) ([]Request, error) {
	if w.Requests <= 0 || w.Load <= 0 || w.MeanDuration <= 0 || gpus <= 0 {
		return nil, fmt.Errorf("workload: requests, load, mean duration and GPUs must be positive")
	}
	r := rand.New(rand.NewPCG(w.Seed, w.Seed^0x9e3779b97f4a7c15))
	// Load = rate * duration * size / GPUs.
	meanGap := w.MeanDuration * w.Mix.Mean() / (w.Load * float64(gpus))
	sizes := w.Mix.Sizes()
	out := make([]Request, w.Requests)
	t := 0.0
	for i := range out {
		gap, err := draw(r, w.Arrival, meanGap)
		if err != nil {
			return nil, fmt.Errorf("arrivals: %w", err)
		}
		d, err := draw(r, w.Duration, w.MeanDuration)
		if err != nil {
			return nil, fmt.Errorf("durations: %w", err)
		}
		t += gap
		u, size := r.Float64(), sizes[len(sizes)-1]
		for _, s := range sizes {
			if u < w.Mix[s] {
				size = s
				break
			}
			u -= w.Mix[s]
		}
		out[i] = Request{ID: i, Size: size, Arrival: t, Duration: d}
	}
	return out, nil
}
