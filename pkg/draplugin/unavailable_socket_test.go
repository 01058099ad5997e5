package draplugin_test

import (
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// waitPublished polls the published devices until ok accepts them.
func waitPublished(t *testing.T, e *env, what string, ok func([]string) bool) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		devices := publishedDevices(t, e)
		if ok(devices) {
			return devices
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: published %v", what, devices)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// By default a node publishes what it has, not what is free: filled to
// the last seat, it publishes the same devices as idle, and the
// scheduler's counters and capacities refuse what is taken.
func TestAFullNodePublishesWhatAnIdleNodeDoes(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	idle := waitPublished(t, e, "idle", func(d []string) bool { return len(d) == 12 })
	for range 32 { // 8 one-GPU groups of 4 seats
		e.prepareOK(e.claim(class1x))
	}
	if alloc, err := e.cluster.Allocate(e.ctx, schedulertest.Claim("one-more", class1x, 1), nodeName); err != nil || alloc != nil {
		t.Fatalf("a 33rd seat on a full node: %v %v", alloc, err)
	}
	if alloc, err := e.cluster.Allocate(e.ctx, schedulertest.Claim("a-pair", class2x, 1), nodeName); err != nil || alloc != nil {
		t.Fatalf("a pair on a node whose every GPU is held: %v %v", alloc, err)
	}
	// Give a republish the time it would take, then compare.
	time.Sleep(time.Second)
	if full := publishedDevices(t, e); !slices.Equal(full, idle) {
		t.Errorf("full node publishes %v, idle %v", full, idle)
	}
}

// With unavailableGroups: hideBlocked a held pair hides the one-GPU groups
// it overlaps, so that the scheduler stops evaluating devices that cannot
// be allocated; releasing it brings them back. The pair itself stays.
func TestHideBlockedHidesWhatAHeldGroupBlocks(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed+"unavailableGroups: hideBlocked\n")
	waitPublished(t, e, "before any claim", func(d []string) bool { return len(d) == 12 })

	var pair []*resourceapi.ResourceClaim
	for range 3 { // every seat of G01
		c := e.claim(class2x)
		env, _ := e.container(e.prepareOK(c)...)
		if env["KYB_GPU_GROUP"] != "G01" {
			t.Fatalf("the pair went to %s, want G01", env["KYB_GPU_GROUP"])
		}
		pair = append(pair, c)
	}
	got := waitPublished(t, e, "after filling G01", func(d []string) bool { return len(d) == 10 })
	for _, hidden := range []string{"g0-1x", "g1-1x"} {
		if slices.Contains(got, hidden) {
			t.Errorf("%s is blocked by G01 and still published: %v", hidden, got)
		}
	}
	if !slices.Contains(got, "g01-2x") {
		t.Errorf("the held group must stay published, full or not: %v", got)
	}
	for _, c := range pair {
		if r := e.unprepare(c)[string(c.UID)]; r.Error != "" {
			t.Fatalf("unprepare: %s", r.Error)
		}
	}
	waitPublished(t, e, "after releasing G01", func(d []string) bool {
		return len(d) == 12 && slices.Contains(d, "g0-1x") && slices.Contains(d, "g1-1x")
	})
}
