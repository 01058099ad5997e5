package room

import (
	"fmt"
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

// While a preemption's victims terminate, the devices it found for the
// pod stay the pod's: a pod of a lower or the same priority that asks for
// one of them does not fit the node, and one that fits elsewhere on the
// node gets another device, though the allocator without the nominated
// pod (the framework's second pass) takes the first free one; a pod of a
// higher priority may take them.
func TestNominatedPodKeepsItsDevices(t *testing.T) {
	f := newFixture(t, threeProfiles, "node-a")
	f.running("low-gpu0", "node-a", class1x, 1, "0")
	f.running("low-gpu1", "node-a", class1x, 1, "1")
	for _, gpu := range []string{"4", "5", "6"} {
		f.running("high-gpu"+gpu, "node-a", class1x, 1, gpu, priority(1000))
	}
	f.start()
	train := f.pending("train", class4x, 1, priority(100))
	out := f.preempt(train)
	if out.nominated != "node-a" || !slices.Equal(out.victims, []string{"low-gpu0", "low-gpu1"}) {
		t.Fatalf("nominated %q evicting %v (%v), want node-a evicting [low-gpu0 low-gpu1]", out.nominated, out.victims, out.status)
	}
	// The victims are gone; the resource-claim controller releases their
	// claims: GPUs 0-3 and 7 are free.
	f.release(out.victims...)

	for _, tc := range []struct {
		name     string
		priority int32
		gpus     string
		fits     bool
		device   string
	}{
		{name: "lower priority, GPU 0", priority: 0, gpus: "0", fits: false},
		{name: "same priority, GPU 2", priority: 100, gpus: "2", fits: false},
		{name: "lower priority, any GPU", priority: 0, fits: true, device: "g7-1x"},
		{name: "higher priority, GPU 0", priority: 200, gpus: "0", fits: true, device: "g0-1x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := f.pendingOn(fmt.Sprintf("seat-%d-%s", tc.priority, tc.gpus), class1x, tc.gpus, priority(tc.priority))
			fits, _, state := f.schedule(pod)
			if got := len(fits) > 0; got != tc.fits {
				t.Fatalf("fits %v, want fits: %t", fits, tc.fits)
			}
			if !tc.fits {
				return
			}
			if got := f.reserve(state, pod, "node-a"); got != tc.device {
				t.Errorf("Reserve takes %s, want %s", got, tc.device)
			}
		})
	}

	// The pod itself fits there, on what was kept for it.
	fits, _, state := f.schedule(train)
	if !slices.Equal(fits, []string{"node-a"}) {
		t.Fatalf("%s fits %v once its victims are gone, want node-a", train.Name, fits)
	}
	if got := f.reserve(state, train, "node-a"); got != "g0123-4x" {
		t.Errorf("%s takes %s, want g0123-4x", train.Name, got)
	}
}
