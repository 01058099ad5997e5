package draplugin_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

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

// Both copies of the checkpoint lost while the statuses of some claims are
// not written yet (they go out a second after the prepare, and not at all
// while the API server refuses them): the rebuild reads those claims back
// from their CDI specs on disk, so that a new claim gets none of their
// seats, and every claim keeps its CDI IDs.
func TestLostCheckpointWithStatusesPartlyWrittenIsRebuiltFromTheSpecs(t *testing.T) {
	var refuse atomic.Bool
	var tries atomic.Int64
	e := newEnv(t, "nvlink-2x4", seed, refuseStatus(&refuse, &tries))
	a := e.claim(class1x)
	idsA := e.prepareOK(a)
	e.waitStatus(a)
	refuse.Store(true) // the statuses of b and c are never written
	b, c := e.claim(class1x), e.claim(class1x)
	idsB, idsC := e.prepareOK(b), e.prepareOK(c)
	envB, _ := e.container(idsB...)
	e.stop()
	checkpointtest.Truncate(t, e.dirs.plugin)
	refuse.Store(false)
	e.start()

	for _, tc := range []struct {
		claim *resourceapi.ResourceClaim
		ids   []string
	}{{a, idsA}, {b, idsB}, {c, idsC}} {
		if again := e.prepareOK(tc.claim); strings.Join(again, " ") != strings.Join(tc.ids, " ") {
			t.Errorf("%s after the rebuild: CDI IDs %v, were %v", tc.claim.Name, again, tc.ids)
		}
	}
	if again, _ := e.container(idsB...); again["KYB_GPU_SEAT"] != envB["KYB_GPU_SEAT"] || again["KYB_SEAT_GEN"] != envB["KYB_SEAT_GEN"] {
		t.Errorf("b's seat after the rebuild: %s gen %s, was %s gen %s", again["KYB_GPU_SEAT"], again["KYB_SEAT_GEN"], envB["KYB_GPU_SEAT"], envB["KYB_SEAT_GEN"])
	}
	taken := map[string]bool{}
	for _, ids := range [][]string{idsA, idsB, idsC} {
		env, _ := e.container(ids...)
		taken[env["KYB_GPU_GROUP"]+"/"+env["KYB_GPU_SEAT"]] = true
	}
	n := e.claim(class1x)
	env, _ := e.container(e.prepareOK(n)...)
	if taken[env["KYB_GPU_GROUP"]+"/"+env["KYB_GPU_SEAT"]] {
		t.Errorf("a new claim got seat %s/%s, which a claim recovered from its spec holds", env["KYB_GPU_GROUP"], env["KYB_GPU_SEAT"])
	}
	st, _, err := checkpoint.NewStore(e.dirs.plugin).Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range []*resourceapi.ResourceClaim{a, b, c} {
		if entry := st.Claims[cl.UID]; entry == nil || entry.Fenced() {
			t.Errorf("%s after the rebuild: %+v", cl.Name, entry)
		}
	}
}

// A damaged version field, or a checkpoint whose checksums match but whose
// content contradicts itself (two of which panicked in start-up repair:
// a crash loop, every GPU of the node unusable), does not stop the plugin:
// it uses the previous copy, or rebuilds when neither copy is sound.
func TestUnsoundCheckpointsDoNotStopTheStart(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	a := e.claim(class1x)
	idsA := e.prepareOK(a)
	e.prepareOK(e.claim(class1x)) // a second save: the first is the previous copy now
	e.stop()
	path := filepath.Join(e.dirs.plugin, checkpoint.FileName)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(raw), `"version":"v1"`, `"version":"v3"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	if again := e.prepareOK(a); strings.Join(again, " ") != strings.Join(idsA, " ") {
		t.Errorf("after a damaged version: CDI IDs %v, were %v", again, idsA)
	}

	// Both copies with the right checksums and contradictory content.
	e.stop()
	st, _, err := checkpoint.NewStore(e.dirs.plugin).Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range st.Claims {
		c.Devices[0].Generations = nil // seats without generations
	}
	bad, err := checkpoint.Encode(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + ".prev"} {
		if err := os.WriteFile(p, bad, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e.start()
	if again := e.prepareOK(a); strings.Join(again, " ") != strings.Join(idsA, " ") {
		t.Errorf("after a contradictory checkpoint: CDI IDs %v, were %v", again, idsA)
	}
}

// A checkpoint lost while the plugin runs and the API server is down: the
// status writes queued meanwhile find no entry and are dropped; once the
// rebuild in the background recovers the claims, their statuses are
// written after all.
func TestStatusesAreWrittenAfterABackgroundRebuild(t *testing.T) {
	var down atomic.Bool
	// What the plugin asks of the API server itself fails; the claims the
	// kubelet's calls fetch are still served.
	outage := withClient(func(c *fake.Clientset) {
		c.PrependReactor("*", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if down.Load() && (a.GetVerb() == "list" || a.GetSubresource() == "status") {
				return true, nil, errors.New("connection refused")
			}
			return false, nil, nil
		})
	})
	e := newEnv(t, "nvlink-2x4", seed, outage)
	a := e.claim(class1x)
	down.Store(true) // before a's status goes out, a second after its prepare
	e.prepareOK(a)
	checkpointtest.Truncate(t, e.dirs.plugin)
	b := e.claim(class1x)
	if r := e.prepare(b)[string(b.UID)]; !strings.Contains(r.Error, "checkpoint was lost") {
		t.Fatalf("a prepare on a lost checkpoint: %q", r.Error)
	}
	time.Sleep(2 * time.Second) // a's status write comes and finds no entry
	down.Store(false)
	e.waitStatus(a)
}
