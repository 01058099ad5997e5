package draplugin_test

import (
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
)

// During a rolling update the old and the new plugin pod serve the node at
// once, on their own sockets, sharing the plugin directory: a claim
// prepared by one is unprepared by the other, and neither hands a seat out
// twice.
func TestRollingUpdateInstancesShareTheCheckpoint(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed, withOptions(func(o *draplugin.Options) { o.PodUID = "pod-old" }))
	old := e.dra
	a := e.claim(class2x)
	idsA := e.prepareOK(a)

	e.opts = func(o *draplugin.Options) { o.PodUID = "pod-new" }
	e.start()
	if err := e.driver.CheckLive(e.ctx); err != nil {
		t.Fatalf("the new instance is not live: %v", err)
	}
	// The new instance's start-up repair kept the old one's claim and spec.
	if env, _ := e.container(idsA...); env["KYB_GPU_SEAT"] != "0" {
		t.Fatalf("claim prepared by the old instance lost: %v", env)
	}
	b := e.claim(class2x)
	envB, _ := e.container(e.prepareOK(b)...)
	if envB["KYB_GPU_SEAT"] != "1" {
		t.Errorf("the new instance handed out seat %s; seat 0 is held through the old one", envB["KYB_GPU_SEAT"])
	}
	if r := e.unprepare(a)[string(a.UID)]; r.Error != "" {
		t.Fatalf("unprepare through the new instance: %s", r.Error)
	}
	// The old instance sees what the new one did.
	e.dra = old
	c := e.claim(class2x)
	envC, _ := e.container(e.prepareOK(c)...)
	if envC["KYB_GPU_SEAT"] != "0" || envC["KYB_SEAT_GEN"] != "2" {
		t.Errorf("old instance after the new one released seat 0: seat %s gen %s, want 0 gen 2", envC["KYB_GPU_SEAT"], envC["KYB_SEAT_GEN"])
	}
	if strings.Join(e.prepareOK(b), "") == "" {
		t.Error("the old instance does not know the new one's claim")
	}
}
