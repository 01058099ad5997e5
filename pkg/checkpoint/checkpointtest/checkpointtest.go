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

// FlipBit flips one bit in the middle of the current copy of the
// checkpoint in dir, as a bad sector does: it fails its checksum, and the
// previous copy, one save behind, is all that is left.
func FlipBit(tb testing.TB, dir string) {
	tb.Helper()
	p := filepath.Join(dir, checkpoint.FileName)
	raw, err := os.ReadFile(p)
	if err != nil {
		tb.Fatal(err)
	}
	raw[len(raw)/2] ^= 0x01
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// Delete deletes both copies of the checkpoint in dir, as an operator
// wiping the plugin's data directory does.
func Delete(tb testing.TB, dir string) {
	tb.Helper()
	for _, f := range []string{checkpoint.FileName, checkpoint.FileName + ".prev"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			tb.Fatal(err)
		}
	}
}
