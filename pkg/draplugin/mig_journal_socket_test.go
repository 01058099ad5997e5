package draplugin_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
)

// TestMIGJournalDamagedInBothCopiesIsRebuiltOverSockets: the plugin stops
// with a MIG claim prepared, and both copies of its MIG journal are found
// damaged at the next start. The start rebuilds the journal from the seat
// checkpoint and NVML and says so in a Node event: the claim the
// checkpoint holds keeps its instance, which its unprepare then leaves
// (no record shows the plugin made it), and the next prepare beside it
// works.
func TestMIGJournalDamagedInBothCopiesIsRebuiltOverSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	held := e.claim(classMIG1g)
	e.prepareOK(held)
	made := e.gpu0Instances()
	if len(made) != 1 {
		t.Fatalf("instances = %v, want the claim's", made)
	}
	e.stop()
	journal := filepath.Join(e.dirs.plugin, miginstance.JournalFile)
	for _, p := range []string{journal, journal + ".prev"} {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, raw[:len(raw)-3], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e.start()
	if note := nodeEvent(t, e, miginstance.ReasonMIGJournalRebuilt); !strings.Contains(note, "the seat checkpoint's claims keep their 1 MIG instance") {
		t.Errorf("Node event %s: %q, want one saying the held claim's instance is kept", miginstance.ReasonMIGJournalRebuilt, note)
	}
	if got := e.gpu0Instances(); !slices.Equal(got, made) {
		t.Fatalf("after the start: instances %v, want %v", got, made)
	}
	records, damaged, err := miginstance.ReadJournal(e.dirs.plugin)
	if err != nil || damaged != nil || len(records) != 1 || records[0].Claim != held.UID || records[0].Phase != miginstance.Adopted {
		t.Fatalf("the rebuilt journal: %v (%v, %v), want the held claim's instance, adopted", records, damaged, err)
	}
	// A repeated prepare of the held claim finds its instance.
	e.prepareOK(held)
	next := e.claim(classMIG1g)
	e.prepareOK(next)
	if got := e.gpu0Instances(); len(got) != 2 {
		t.Errorf("after the next claim's prepare: instances %v, want two", got)
	}
	if r := e.unprepare(held)[string(held.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	if got := e.gpu0Instances(); !slices.Contains(got, made[0]) {
		t.Errorf("after the held claim's unprepare: instances %v, want its instance %s left", got, made[0])
	}
}
