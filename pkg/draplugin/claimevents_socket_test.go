package draplugin_test

import (
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// claimEvents waits until the events on claim number want, and returns
// them.
func claimEvents(t *testing.T, e *env, claim *resourceapi.ResourceClaim, want int) []eventsv1.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := e.client.EventsV1().Events(claim.Namespace).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []eventsv1.Event
		for _, ev := range evs.Items {
			if ev.Regarding.Kind == "ResourceClaim" && ev.Regarding.UID == claim.UID {
				out = append(out, ev)
			}
		}
		if len(out) >= want || time.Now().After(deadline) {
			return out
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A claim hears from the node where its seats are, or why it got none;
// a failure the kubelet retries is told once.
func TestClaimsHearWhatTheNodeDid(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	good := e.claim(class2x)
	e.prepareOK(good)
	evs := claimEvents(t, e, good, 1)
	if len(evs) != 1 || evs[0].Reason != "Prepared" || evs[0].Type != "Normal" ||
		evs[0].Note != "seat 0 (generation 1) of G01 (g01-2x: GPU 0,1) on "+nodeName || evs[0].Related == nil || evs[0].Related.Name != nodeName {
		t.Errorf("events on a prepared claim: %+v", evs)
	}
	// A repeated prepare (the kubelet after a restart) tells nothing new.
	e.prepareOK(good)

	bad := e.claim(class2x)
	bad.Status.Allocation.Devices.Results[0].Device = "g89-2x"
	bad = e.update(bad)
	for range 3 {
		if r := e.prepare(bad)[string(bad.UID)]; r == nil || r.Error == "" {
			t.Fatalf("a claim of a device the node lacks was prepared: %+v", r)
		}
	}
	evs = claimEvents(t, e, bad, 1)
	time.Sleep(200 * time.Millisecond)
	evs = claimEvents(t, e, bad, len(evs))
	if len(evs) != 1 || evs[0].Reason != "PrepareFailed" || evs[0].Type != "Warning" || !strings.Contains(evs[0].Note, "g89-2x") {
		t.Errorf("events on a refused claim prepared three times: %+v", evs)
	}
	if evs := claimEvents(t, e, good, 1); len(evs) != 1 {
		t.Errorf("events on the good claim after a repeated prepare: %d", len(evs))
	}
}
