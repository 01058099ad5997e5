package draplugin_test

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint/checkpointtest"
)

func TestLostCheckpointIsRebuiltFromTheAPIServer(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	a, b := e.claim(class2x), e.claim(class2x)
	idsA := e.prepareOK(a)
	e.prepareOK(b)
	e.stop()
	checkpointtest.Truncate(t, e.dirs.plugin)
	e.start()

	if again := e.prepareOK(a); strings.Join(again, " ") != strings.Join(idsA, " ") {
		t.Errorf("after the rebuild the claim's CDI IDs are %v, were %v", again, idsA)
	}
	envA, _ := e.container(idsA...)
	if envA["KYB_GPU_SEAT"] != "0" || envA["KYB_SEAT_GEN"] != "1" {
		t.Errorf("rebuilt seat %s gen %s, want 0 gen 1", envA["KYB_GPU_SEAT"], envA["KYB_SEAT_GEN"])
	}
	c := e.claim(class2x)
	envC, _ := e.container(e.prepareOK(c)...)
	if envC["KYB_GPU_SEAT"] != "2" {
		t.Errorf("a new claim got seat %s; seats 0 and 1 are held", envC["KYB_GPU_SEAT"])
	}
	if gen := envC["KYB_SEAT_GEN"]; len(gen) < 10 {
		t.Errorf("generation %s after a rebuild must start above the floor (the clock), so no earlier generation repeats", gen)
	}
	kept, _ := filepath.Glob(filepath.Join(e.dirs.plugin, checkpoint.FileName+"*.corrupt-*"))
	if len(kept) != 2 {
		t.Errorf("the unusable files must be kept aside for diagnosis: %v", kept)
	}
}

func TestLostCheckpointWithTheAPIServerDown(t *testing.T) {
	var down atomic.Bool
	e := newEnv(t, "nvlink-2x4", seed, apiOutage(&down))
	a := e.claim(class2x)
	e.prepareOK(a)
	b := e.claim(class2x)
	e.stop()
	checkpointtest.Truncate(t, e.dirs.plugin)
	down.Store(true)
	e.start()

	// b's claim cannot even be read while the API server is down; once it
	// answers, the plugin rebuilds in the background.
	if r := e.unprepare(a)[string(a.UID)]; r.Error != "" {
		t.Errorf("unprepare without a checkpoint: %s", r.Error)
	}
	down.Store(false)
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := e.prepare(b)[string(b.UID)]
		if r.Error == "" {
			break
		}
		if !strings.Contains(r.Error, "checkpoint was lost") {
			t.Fatalf("prepare while the checkpoint is lost: %q", r.Error)
		}
		if time.Now().After(deadline) {
			t.Fatalf("never rebuilt: %s", r.Error)
		}
		time.Sleep(200 * time.Millisecond)
	}
	envB, _ := e.container(e.prepareOK(b)...)
	if envB["KYB_GPU_SEAT"] != "0" {
		t.Errorf("after the rebuild b got seat %s; a was unprepared, so seat 0 is free", envB["KYB_GPU_SEAT"])
	}
}
