// Package checkpointtest damages checkpoints the way a node does, for
// tests of what the plugin makes of them. It is for tests only; no binary
// links it (hack/deps-check.sh).
package checkpointtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// Truncate cuts both copies of the checkpoint in dir to a third, as a
// torn write or a full disk leaves them: neither passes its checksum.
func Truncate(tb testing.TB, dir string) {
	tb.Helper()
	for _, f := range []string{checkpoint.FileName, checkpoint.FileName + ".prev"} {
		p := filepath.Join(dir, f)
		raw, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, raw[:len(raw)/3], 0o600); err != nil {
			tb.Fatal(err)
		}
	}
}
