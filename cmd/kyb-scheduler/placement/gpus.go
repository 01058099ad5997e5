package placement

import "math/bits"

// gpuSet is a set of GPU indices of one node.
type gpuSet []uint64

func (s *gpuSet) add(i int) {
	for len(*s) <= i/64 {
		*s = append(*s, 0)
	}
	(*s)[i/64] |= 1 << (i % 64)
}

func (s *gpuSet) addAll(o gpuSet) {
	for i, w := range o {
		for len(*s) <= i {
			*s = append(*s, 0)
		}
		(*s)[i] |= w
	}
}

// each calls f with every GPU of the set, in ascending order.
func (s gpuSet) each(f func(int)) {
	for i, w := range s {
		for w != 0 {
			f(64*i + bits.TrailingZeros64(w))
			w &= w - 1
		}
	}
}

func (s gpuSet) overlaps(o gpuSet) bool {
	for i := range min(len(s), len(o)) {
		if s[i]&o[i] != 0 {
			return true
		}
	}
	return false
}

func (s gpuSet) count() int {
	n := 0
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return n
}

// bound is one more than the highest GPU index in the set, 0 if empty.
func (s gpuSet) bound() int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] != 0 {
			return 64*i + bits.Len64(s[i])
		}
	}
	return 0
}
