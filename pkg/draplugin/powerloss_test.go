package draplugin_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// A power loss may take the saves of the last moments: the checkpoint on
// disk after the reboot is an older one. Here it still holds a claim that
// was unprepared and deleted before the power went, and misses one that was
// prepared. The next start must release the first (nobody else will) and
// prepare the second again without repeating a seat generation.
func TestPowerLossLosingTheLastSaves(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	ckpt := filepath.Join(e.dirs.plugin, checkpoint.FileName)

	gone := e.claim(class2x)
	e.prepareOK(gone)
	durable, err := os.ReadFile(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	lost := e.claim(class1x)
	envBefore, _ := e.container(e.prepareOK(lost)...)
	genBefore, _ := strconv.ParseInt(envBefore["KYB_SEAT_GEN"], 10, 64)
	if r := e.unprepare(gone)[string(gone.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if err := e.client.ResourceV1().ResourceClaims(gone.Namespace).Delete(e.ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The power goes: what was not flushed is lost, CDI specs included.
	e.stop()
	if err := os.WriteFile(ckpt, durable, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(ckpt + ".prev")
	specs, _ := filepath.Glob(filepath.Join(e.dirs.cdi, "*"))
	for _, s := range specs {
		os.Remove(s)
	}
	e.setBootID("boot-after-power-loss")
	e.start()

	// The deleted claim's seats are released in the background.
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, _, err := checkpoint.NewStore(e.dirs.plugin).Load()
		if err != nil {
			t.Fatal(err)
		}
		if _, held := st.Claims[gone.UID]; !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the seats of a claim deleted before the power loss are still held")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var event string
	events, err := e.client.EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		if ev.Reason == "StaleClaimReleased" {
			event = ev.Note
		}
	}
	if event == "" {
		t.Error("no StaleClaimReleased event")
	}

	// The kubelet prepares the claim again after the reboot: it gets a
	// seat whose generation was never handed out.
	envAfter, _ := e.container(e.prepareOK(lost)...)
	genAfter, _ := strconv.ParseInt(envAfter["KYB_SEAT_GEN"], 10, 64)
	if genAfter <= genBefore {
		t.Errorf("generation after the power loss %d, handed out before it %d: a generation repeated", genAfter, genBefore)
	}
	// And the deleted pair's GPUs are free again for a new pair.
	pair := e.claim(class2x)
	if env, _ := e.container(e.prepareOK(pair)...); env["KYB_GPU_GROUP"] == "" {
		t.Errorf("no group for a new pair: %v", env)
	}
}

// Saves do not wait for the disk; the flusher makes them durable behind
// the calls and then drops the copies that saves put aside. A burst of
// prepares must still end flushed: no copy left aside, and the checkpoint
// on disk holding every claim.
func TestABurstOfSavesIsFlushed(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	var claims []string
	for range 4 {
		c := e.claim(class1x)
		e.prepareOK(c)
		claims = append(claims, string(c.UID))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		aside, err := filepath.Glob(filepath.Join(e.dirs.plugin, checkpoint.FileName+".*.old"))
		if err != nil {
			t.Fatal(err)
		}
		if len(aside) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after a burst of saves, copies are still aside (no flush ran): %v", aside)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, _, err := checkpoint.NewStore(e.dirs.plugin).Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range claims {
		if _, ok := st.Claims[types.UID(uid)]; !ok {
			t.Errorf("claim %s is not in the flushed checkpoint", uid)
		}
	}
}
