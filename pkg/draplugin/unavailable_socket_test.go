package draplugin_test

import (
	"slices"
	"testing"
	"time"
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

// A held pair hides the one-GPU groups it overlaps, so that the scheduler
// stops visiting devices that cannot be allocated; releasing it brings them
// back. With unavailableGroups: publish, nothing is hidden.
func TestHeldGroupHidesTheGroupsItBlocks(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	waitPublished(t, e, "before any claim", func(d []string) bool { return len(d) == 12 })

	c := e.claim(class2x)
	env, _ := e.container(e.prepareOK(c)...)
	if env["KYB_GPU_GROUP"] != "G01" {
		t.Fatalf("the first pair went to %s, want G01", env["KYB_GPU_GROUP"])
	}
	got := waitPublished(t, e, "after preparing G01", func(d []string) bool { return len(d) == 10 })
	for _, hidden := range []string{"g0-1x", "g1-1x"} {
		if slices.Contains(got, hidden) {
			t.Errorf("%s is blocked by G01 and still published: %v", hidden, got)
		}
	}
	if !slices.Contains(got, "g01-2x") {
		t.Errorf("the held group itself must stay published (it has free seats): %v", got)
	}

	if r := e.unprepare(c)[string(c.UID)]; r.Error != "" {
		t.Fatalf("unprepare: %s", r.Error)
	}
	waitPublished(t, e, "after releasing G01", func(d []string) bool {
		return len(d) == 12 && slices.Contains(d, "g0-1x") && slices.Contains(d, "g1-1x")
	})
}

func TestUnavailableGroupsPublishKeepsEveryGroup(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed+"unavailableGroups: publish\n")
	c := e.claim(class2x)
	e.prepareOK(c)
	// Give a republish the time it would take, then check nothing went.
	time.Sleep(time.Second)
	if got := publishedDevices(t, e); len(got) != 12 {
		t.Errorf("unavailableGroups: publish hid devices: %v", got)
	}
}
