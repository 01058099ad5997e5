package checkpoint

import (
	"testing"
)

// Two stores on one directory are the two plugin instances of a rolling
// update: each must see when the other replaced the file, and not its own
// saves.
func TestChangedSeesOnlyAnotherWritersSave(t *testing.T) {
	dir := t.TempDir()
	a, b := NewStore(dir), NewStore(dir)
	if err := a.Save(sample()); err != nil {
		t.Fatal(err)
	}
	if a.Changed() {
		t.Error("a store's own save counts as a change")
	}
	if !b.Changed() {
		t.Error("a store that never read the file does not see it as changed")
	}
	if _, _, err := b.Load(); err != nil {
		t.Fatal(err)
	}
	if b.Changed() {
		t.Error("changed right after a load")
	}
	st := sample()
	st.Claims["uid-1"].StatusWritten = true
	if err := b.Save(st); err != nil {
		t.Fatal(err)
	}
	if !a.Changed() {
		t.Error("a does not see b's save")
	}
	got, _, err := a.Load()
	if err != nil || !got.Claims["uid-1"].StatusWritten {
		t.Fatalf("StatusWritten lost in the round trip: %v", err)
	}
	if err := a.Sync(); err != nil {
		t.Errorf("sync: %v", err)
	}
}

func TestRaiseGenerationFloor(t *testing.T) {
	st := sample() // seat g01-2x/0 at generation 3
	st.RaiseGenerationFloor(100)
	if g := st.NextGeneration("g01-2x", 0); g <= 3+lostHandouts {
		t.Errorf("next generation %d of a seat at 3: a lost save may have handed it out", g)
	}
	if g := st.NextGeneration("g23-2x", 1); g <= 100 {
		t.Errorf("next generation %d of a fresh seat, want above the clock 100", g)
	}
	st = sample()
	st.RaiseGenerationFloor(1_000_000)
	if g := st.NextGeneration("g01-2x", 0); g != 1_000_001 {
		t.Errorf("next generation %d, want 1000001 (the clock leads)", g)
	}
}
