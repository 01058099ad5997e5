package draplugin

import (
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// migJournal is what the MIG journal needs of the node beside NVML: its
// boot, which its records carry, and where it reports a damaged journal
// (miginstance/recover.go).
type migJournal struct {
	bootID string
	events *nodeevents.Recorder
}

// heldInCheckpoint says which MIG devices the claims of the seat
// checkpoint in dir hold: what a MIG journal damaged in both copies is
// rebuilt from. It reads the file, not the ledger, since the journal is
// first read before the ledger opens; the checkpoint records a claim's
// seat before its instance is made, so every instance a claim may hold
// is named there. A checkpoint that cannot be read names none.
func (s *migSeats) heldInCheckpoint(dir string) miginstance.Held {
	return func() ([]miginstance.Want, bool) {
		st, _, err := checkpoint.NewStore(dir).Load()
		if err != nil {
			return nil, false
		}
		var held []miginstance.Want
		for uid, c := range st.Claims {
			for _, dev := range c.Devices {
				if w, ok := s.want(uid, dev); ok {
					held = append(held, w)
				}
			}
		}
		return held, true
	}
}
