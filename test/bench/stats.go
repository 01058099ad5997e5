package bench

import (
	"slices"
	"time"
)

// Percentile is the p-th percentile (0..100) of ds by the nearest-rank
// method: p99 of 64 samples is the largest.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

// Median is the median of xs (the lower middle for an even count).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// MedianDuration is the median of ds.
func MedianDuration(ds []time.Duration) time.Duration {
	return Percentile(ds, 50)
}

// Mean is the mean of ds.
func Mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}
