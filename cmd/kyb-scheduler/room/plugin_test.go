package room

import (
	"slices"
	"testing"
)

// On a node whose 1x seats of GPUs 0, 1, 2, 4 and 5 are held by
// low-priority pods, a 4x request evicts the pods of GPUs 4 and 5 (two),
// not those of 0, 1 and 2 (three), though the published order tries the
// group of GPUs 0-3 first. A second node needs three victims whichever
// group: the preemption nominates the first.
func TestFewestVictims(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a", "node-b")
	for _, gpu := range []string{"0", "1", "2", "4", "5"} {
		f.running("a-gpu"+gpu, "node-a", class1x, 1, gpu)
	}
	for _, gpu := range []string{"0", "1", "2", "4", "5", "6"} {
		f.running("b-gpu"+gpu, "node-b", class1x, 1, gpu)
	}
	f.start()
	out := f.preempt(f.pending("train", class4x, 1, priority(100)))
	if !out.status.IsSuccess() {
		t.Fatalf("preemption failed: %v", out.status)
	}
	if out.nominated != "node-a" || !slices.Equal(out.victims, []string{"a-gpu4", "a-gpu5"}) {
		t.Errorf("nominated %q evicting %v, want node-a evicting [a-gpu4 a-gpu5]", out.nominated, out.victims)
	}
}
