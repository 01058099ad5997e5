// Package durablefile keeps a small JSON state file that no crash and no
// single damaged copy loses: the seat checkpoint and the MIG journal.
//
// On disk the content goes in an envelope that says which version of it
// the file holds and checksums it:
//
//	{"version": "v1", "checksum": "sha256:<hex of data>",
//	 "sum": "sha256:<hex of kind, version and data>", "data": {...}}
//
// checksum covers the bytes of data as stored (in compact form), not a
// re-encoding of the decoded content, so that a newer program whose types
// grew a field still verifies an older file; sum covers the version (and
// the kind of file) as well, so that a flipped bit in the version is a
// damaged file (and the previous copy is used), not a "newer" one that
// stops the program. The seat checkpoint was written with checksum alone
// before sum existed, in its v1 only (Format.Unsummed).
//
// Writes are atomic (temp file, rename), and the previous good file is
// kept beside it (<name>.prev) as a fallback against damage. A save is
// safe against the program crashing the moment it returns (the page
// cache outlives the process); Sync makes it durable against the node
// losing power.
package durablefile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrCorrupt says a file failed its checksums, did not parse, or could
// not be read: it is not trusted, and the previous copy is used.
var ErrCorrupt = errors.New("file is corrupt")

// ErrNewerVersion says a file was verifiably written by a newer program:
// it is neither read nor overwritten, and no previous copy replaces it.
var ErrNewerVersion = errors.New("file was written by a newer plugin")

// Format is one kind of file's envelope.
type Format struct {
	// Kind names the content in sum ("checkpoint"): a file of one kind
	// never verifies as another's.
	Kind string
	// Latest is the newest version this program reads: a verified file
	// of a later one is ErrNewerVersion.
	Latest string
	// Unsummed is the one version that may lack sum (files written before
	// it existed); empty: every file has one.
	Unsummed string
}

type envelope struct {
	Version string `json:"version"`
	// Checksum covers the data alone: what readers before Sum verify.
	Checksum string `json:"checksum"`
	// Sum covers the kind, the version and the data.
	Sum  string          `json:"sum,omitempty"`
	Data json.RawMessage `json:"data"`
}

// Checksum is the checksum of data.
func Checksum(data []byte) string {
	h := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(h[:])
}

// Sum is the checksum over a version and its data.
func (f Format) Sum(version string, data []byte) string {
	h := sha256.New()
	h.Write([]byte("kyb.ai " + f.Kind + " " + version + "\n"))
	h.Write(data)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Seal puts data (compact JSON) in its envelope: one line, the data as it
// was checksummed.
func (f Format) Seal(version string, data []byte) ([]byte, error) {
	head, err := json.Marshal(struct {
		Version  string `json:"version"`
		Checksum string `json:"checksum"`
		Sum      string `json:"sum"`
	}{version, Checksum(data), f.Sum(version, data)})
	if err != nil {
		return nil, err
	}
	// {"version":…,"checksum":…,"sum":…,"data":<data>}
	out := make([]byte, 0, len(head)+len(data)+10)
	out = append(out, head[:len(head)-1]...)
	out = append(out, `,"data":`...)
	out = append(out, data...)
	out = append(out, "}\n"...)
	return out, nil
}

// Open verifies an envelope, both checksums where the file has them, over
// the data in compact form (the file may be indented for people), and
// returns its version and data. name is used in errors. Every error wraps
// ErrCorrupt, except ErrNewerVersion for a file of a version after Latest
// that verifies.
func (f Format) Open(raw []byte, name string) (version string, data []byte, err error) {
	env, data, err := f.open(raw)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
	}
	if n, ok := VersionNumber(env.Version); ok {
		if latest, _ := VersionNumber(f.Latest); n > latest {
			return "", nil, fmt.Errorf("%w: %s: version %q (this plugin reads up to %s); refusing to touch it", ErrNewerVersion, name, env.Version, f.Latest)
		}
	}
	return env.Version, data, nil
}

func (f Format) open(raw []byte) (*envelope, []byte, error) {
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, nil, err
	}
	if env.Version == "" || len(env.Data) == 0 {
		return nil, nil, errors.New("no version or no data")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, env.Data); err != nil {
		return nil, nil, err
	}
	data := compact.Bytes()
	if got := Checksum(data); got != env.Checksum {
		return nil, nil, fmt.Errorf("checksum %s does not match its data (%s)", env.Checksum, got)
	}
	switch {
	case env.Sum != "":
		if got := f.Sum(env.Version, data); got != env.Sum {
			return nil, nil, fmt.Errorf("sum %s does not match its version %q and data (%s)", env.Sum, env.Version, got)
		}
	case f.Unsummed == "":
		return nil, nil, errors.New("no sum")
	case env.Version != f.Unsummed:
		// Files before sum were of one version only: another version
		// without a sum is a damaged one.
		return nil, nil, fmt.Errorf("version %q has no sum; only %s files may lack one", env.Version, f.Unsummed)
	}
	return &env, data, nil
}

// VersionNumber parses "v<n>".
func VersionNumber(v string) (int, bool) {
	s, ok := strings.CutPrefix(v, "v")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}
