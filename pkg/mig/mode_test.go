package mig

import "testing"

func TestModeChangeNeedsReset(t *testing.T) {
	for arch, want := range map[string]bool{"ampere": true, "hopper": false, "blackwell": false, "": true} {
		if got := ModeChangeNeedsReset(arch); got != want {
			t.Errorf("ModeChangeNeedsReset(%q) = %v, want %v", arch, got, want)
		}
	}
}
