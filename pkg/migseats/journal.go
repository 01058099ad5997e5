package migseats

import (
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
)

// heldInCheckpoint says which MIG devices the claims of the seat
// checkpoint in dir hold: what a MIG journal damaged in both copies is
// rebuilt from. It reads the file, not the ledger, since the journal is
// first read before the ledger opens; the checkpoint records a claim's
// seat before its instance is made, so every instance a claim may hold
// is named there. A checkpoint that cannot be read names none.
func (s *Seats) heldInCheckpoint(dir string) miginstance.Held {
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
