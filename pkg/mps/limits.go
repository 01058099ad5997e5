package mps

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Limits are an MPS client's shares of its group: the share of SMs and, per
// GPU in the order the client and the daemon enumerate them (the group's
// GPUs by index), the device memory it may pin.
type Limits struct {
	ActiveThreadPercentage int     `json:"activeThreadPercentage"`
	PinnedMemMiB           []int64 `json:"pinnedMemMiB"`
}

// Equal reports whether two limits are the same.
func (l Limits) Equal(o Limits) bool {
	return l.ActiveThreadPercentage == o.ActiveThreadPercentage && slices.Equal(l.PinnedMemMiB, o.PinnedMemMiB)
}

// Share is what a claim holding k of a group's S seats gets: 100·k/S per
// cent of the SMs and k/S of each GPU's memory, rounded down, so that the
// shares of a full group never add up to more than the GPU has.
func Share(k, seats int, memoryMiB []int64) Limits {
	l := Limits{ActiveThreadPercentage: 100 * k / seats}
	for _, m := range memoryMiB {
		l.PinnedMemMiB = append(l.PinnedMemMiB, m*int64(k)/int64(seats))
	}
	return l
}

// Sized is what a claim holding a size gets on a group of gpus GPUs: its
// compute as the active thread percentage (at most 100: several sized
// seats of one request add up), and its memory, in whole MiB, on each
// GPU (a sized seat's memory is per GPU of its group).
func Sized(memoryBytes, computePercent int64, gpus int) Limits {
	l := Limits{ActiveThreadPercentage: int(min(computePercent, 100))}
	for range gpus {
		l.PinnedMemMiB = append(l.PinnedMemMiB, memoryBytes>>20)
	}
	return l
}

// Max is the larger share of each limit.
func Max(a, b Limits) Limits {
	out := Limits{ActiveThreadPercentage: max(a.ActiveThreadPercentage, b.ActiveThreadPercentage)}
	for i := range max(len(a.PinnedMemMiB), len(b.PinnedMemMiB)) {
		var x, y int64
		if i < len(a.PinnedMemMiB) {
			x = a.PinnedMemMiB[i]
		}
		if i < len(b.PinnedMemMiB) {
			y = b.PinnedMemMiB[i]
		}
		out.PinnedMemMiB = append(out.PinnedMemMiB, max(x, y))
	}
	return out
}

// MemLimitEnv is the value of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: "0=20389M,1=20389M".
func (l Limits) MemLimitEnv() string {
	parts := make([]string, len(l.PinnedMemMiB))
	for i, m := range l.PinnedMemMiB {
		parts[i] = fmt.Sprintf("%d=%dM", i, m)
	}
	return strings.Join(parts, ",")
}

// ParseMemLimit reads a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value in MiB per
// device ordinal; suffixes M and G.
func ParseMemLimit(s string) (map[int]int64, error) {
	out := map[int]int64{}
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		dev, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want <device>=<value>", part)
		}
		d, err := strconv.Atoi(dev)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%q: device %q is not an ordinal", part, dev)
		}
		mib, err := ParseMiB(val)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		out[d] = mib
	}
	return out, nil
}

// ParseMiB reads "20389M" or "20G" as MiB.
func ParseMiB(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1024, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		s = strings.TrimSuffix(s, "M")
	default:
		return 0, fmt.Errorf("value %q needs a unit, M or G", s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("value %q is not a size", s)
	}
	return n * mult, nil
}
