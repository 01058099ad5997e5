package checkpoint

import (
	"encoding/json"

	"github.com/kyb-ai/kyb-dra-driver/pkg/durablefile"
)

// The envelope's parts, for tests that write files by hand.

func checksum(data []byte) string { return durablefile.Checksum(data) }

func sum(version string, data []byte) string { return format.Sum(version, data) }

func (s *Store) prevPath() string { return s.file.PrevPath() }

// envelope is the file as a reader of its parts sees it.
type envelope struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Sum      string          `json:"sum"`
	Data     json.RawMessage `json:"data"`
}
