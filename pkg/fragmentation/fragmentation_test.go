package fragmentation

import (
	"testing"
)

// eightGPUs is a node of eight GPUs as the planner cuts one with NVLink
// pairs and four-GPU islands: 1x groups 0..7, 2x 01 23 45 67, 4x 0123
// 4567, all whole. unhealthy names GPUs whose groups are tainted.
func eightGPUs(unhealthy ...int) []Group {
	var out []Group
	add := func(gpus ...int) {
		g := Group{GPUs: gpus, Whole: true}
		for _, u := range unhealthy {
			for _, i := range gpus {
				g.Unhealthy = g.Unhealthy || i == u
			}
		}
		out = append(out, g)
	}
	for i := range 8 {
		add(i)
	}
	for i := 0; i < 8; i += 2 {
		add(i, i+1)
	}
	add(0, 1, 2, 3)
	add(4, 5, 6, 7)
	return out
}

// migOnGPU0 is eightGPUs with two MIG instances on GPU 0.
func migOnGPU0() []Group {
	return append(eightGPUs(), Group{GPUs: []int{0}}, Group{GPUs: []int{0}})
}

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups []Group
		inUse  []int
		want   Measure
	}{
		{"empty node: every GPU inside a free 4x group", eightGPUs(), nil,
			Measure{Free: 8, Largest: 4, Inside: 8}},
		{"GPUs 0 and 5 busy: both 4x groups broken", eightGPUs(), []int{0, 5},
			Measure{Free: 6, Largest: 4, Inside: 0, Fragmented: 6}},
		{"GPUs 0 and 1 busy: 4567 whole", eightGPUs(), []int{1, 0},
			Measure{Free: 6, Largest: 4, Inside: 4, Fragmented: 2}},
		{"in use given twice counts once", eightGPUs(), []int{2, 2, 2},
			Measure{Free: 7, Largest: 4, Inside: 4, Fragmented: 3}},
		{"full node", eightGPUs(), []int{0, 1, 2, 3, 4, 5, 6, 7},
			Measure{Largest: 4}},
		{"a MIG instance held on GPU 0: the GPU is not free", migOnGPU0(), []int{0},
			Measure{Free: 7, Largest: 4, Inside: 4, Fragmented: 3}},
		{"MIG instances published, none held: no larger group, GPU 0 free", migOnGPU0(), nil,
			Measure{Free: 8, Largest: 4, Inside: 8}},
		{"one-GPU node", []Group{{GPUs: []int{0}, Whole: true}}, nil,
			Measure{Free: 1, Largest: 1, Inside: 1}},
		{"one-GPU node in use", []Group{{GPUs: []int{0}, Whole: true}}, []int{0},
			Measure{Largest: 1}},
		{"1x groups only, two busy: nothing fragmented",
			[]Group{{GPUs: []int{0}, Whole: true}, {GPUs: []int{1}, Whole: true}, {GPUs: []int{2}, Whole: true}, {GPUs: []int{3}, Whole: true}},
			[]int{1, 3}, Measure{Free: 2, Largest: 1, Inside: 2}},
		{"overprovisioning groups alone: no group takes GPUs whole",
			[]Group{{GPUs: []int{0}}, {GPUs: []int{1}}, {GPUs: []int{0, 1}}}, []int{0},
			Measure{Free: 1, Largest: 0, Inside: 1}},
		{"an overprovisioning 8x group does not make the largest size",
			append(eightGPUs(), Group{GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}), []int{0},
			Measure{Free: 7, Largest: 4, Inside: 4, Fragmented: 3}},
		{"GPU 3 unhealthy: neither free nor in use, 0123 no free group", eightGPUs(3), nil,
			Measure{Free: 7, Largest: 4, Inside: 4, Fragmented: 3}},
		{"GPU 3 unhealthy and GPU 4 busy: no free 4x group left", eightGPUs(3), []int{4},
			Measure{Free: 6, Largest: 4, Inside: 0, Fragmented: 6}},
		{"every 4x group unhealthy: the largest healthy group is 2x", eightGPUs(3, 4), []int{0},
			Measure{Free: 5, Largest: 2, Inside: 2, Fragmented: 3}},
		{"4x groups alone, one unhealthy: its GPUs take no seat",
			[]Group{{GPUs: []int{0, 1, 2, 3}, Whole: true, Unhealthy: true}, {GPUs: []int{4, 5, 6, 7}, Whole: true}}, nil,
			Measure{Free: 4, Largest: 4, Inside: 4}},
		{"six GPUs, one 4x group: two fragmented while empty",
			[]Group{{GPUs: []int{0, 1, 2, 3}, Whole: true}, {GPUs: []int{4, 5}, Whole: true}}, nil,
			Measure{Free: 6, Largest: 4, Inside: 4, Fragmented: 2}},
		{"overlapping 4x groups: a free one inside",
			[]Group{{GPUs: []int{0, 1, 2, 3}, Whole: true}, {GPUs: []int{2, 3, 4, 5}, Whole: true}, {GPUs: []int{4, 5, 6, 7}, Whole: true}},
			[]int{0, 7}, Measure{Free: 6, Largest: 4, Inside: 4, Fragmented: 2}},
		{"no groups", nil, []int{0}, Measure{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Of(tc.groups, tc.inUse); got != tc.want {
				t.Errorf("Of = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestClusterAddsNodes(t *testing.T) {
	var c Measure
	c.Add(Measure{Free: 6, Largest: 4, Inside: 0, Fragmented: 6})
	c.Add(Measure{Free: 8, Largest: 8, Inside: 8})
	c.Add(Measure{Free: 1, Largest: 1, Inside: 1})
	if want := (Measure{Free: 15, Largest: 8, Inside: 9, Fragmented: 6}); c != want {
		t.Errorf("cluster %+v, want %+v", c, want)
	}
	if got := c.Share(); got != 0.4 {
		t.Errorf("share %v, want 0.4", got)
	}
	if got := (Measure{}).Share(); got != 0 {
		t.Errorf("share of no free GPU %v, want 0", got)
	}
}
