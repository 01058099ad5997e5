package mig

import "slices"

// modeChangesAtOnce are the architectures whose MIG mode changes take
// effect at once. Ampere's wait for a GPU reset with no process on the
// GPU, which no plugin may force on a node running workloads.
var modeChangesAtOnce = []string{"hopper", "blackwell"}

// ModeChangeNeedsReset says whether a MIG mode change on a GPU of the
// architecture (as pkg/inventory names it: "ampere", "hopper", …) waits
// for a GPU reset.
func ModeChangeNeedsReset(architecture string) bool {
	return !slices.Contains(modeChangesAtOnce, architecture)
}
