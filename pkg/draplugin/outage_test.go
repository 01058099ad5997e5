package draplugin_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// apiOutage makes the fake API server unreachable while down is set.
func apiOutage(down *atomic.Bool) envOption {
	return withClient(func(c *fake.Clientset) {
		refuse := errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
		c.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
			if down.Load() {
				return true, nil, refuse
			}
			return false, nil, nil
		})
		c.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
			if down.Load() {
				return true, nil, refuse
			}
			return false, nil, nil
		})
	})
}

func TestAPIServerDownAtStartAndMidRun(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	started := time.Now()
	e := newEnv(t, "nvlink-2x4", seed, apiOutage(&down))
	if d := time.Since(started); d > 10*time.Second {
		t.Errorf("start took %v with the API server down; it must not wait for it", d)
	}
	// Without the API server the plugin still answers the kubelet.
	if err := e.driver.CheckLive(e.ctx); err != nil {
		t.Errorf("liveness with the API server down: %v", err)
	}
	down.Store(false)
	a := e.claim(class2x)
	idsA := e.prepareOK(a)
	// Every one of the 12 groups, the held pair's included.
	deadline := time.Now().Add(60 * time.Second)
	for len(publishedDevices(t, e)) != 12 {
		if time.Now().After(deadline) {
			t.Fatalf("slices not published after the API server came back: %v", publishedDevices(t, e))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Mid-run outage: new claims cannot be read, so their prepare fails
	// (the kubelet retries); unprepare needs no API server.
	b := e.claim(class2x)
	down.Store(true)
	resp, err := e.dra.NodePrepareResources(e.ctx, prepareRequest(b))
	if err == nil && resp.Claims[string(b.UID)].Error == "" {
		t.Error("prepare succeeded without the API server to read the claim from")
	} else if err != nil && !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("prepare error does not say why: %v", err)
	}
	if r := e.unprepare(a)[string(a.UID)]; r.Error != "" {
		t.Errorf("unprepare during the outage: %s", r.Error)
	}
	down.Store(false)
	envB, _ := e.container(e.prepareOK(b)...)
	if envB["KYB_GPU_SEAT"] != "0" || envB["KYB_SEAT_GEN"] != "2" {
		t.Errorf("after the outage: seat %s gen %s, want seat 0 (released during the outage) gen 2", envB["KYB_GPU_SEAT"], envB["KYB_SEAT_GEN"])
	}
	_ = idsA
}
