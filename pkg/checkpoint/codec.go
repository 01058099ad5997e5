package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

type envelope struct {
	Version string `json:"version"`
	// Checksum covers the data alone: what plugins before Sum verify.
	Checksum string `json:"checksum"`
	// Sum covers the version and the data.
	Sum  string          `json:"sum,omitempty"`
	Data json.RawMessage `json:"data"`
}

func checksum(data []byte) string {
	h := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(h[:])
}

// sum is the checksum over a version and its data.
func sum(version string, data []byte) string {
	h := sha256.New()
	h.Write([]byte("kyb.ai checkpoint " + version + "\n"))
	h.Write(data)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Decode parses and verifies checkpoint bytes; name is used in errors.
// Every error wraps ErrCorrupt, except ErrNewerVersion for a file that a
// newer plugin verifiably wrote.
func Decode(raw []byte, name string) (*State, error) {
	env, data, err := open(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
	}
	st, err := convert(env.Version, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return st, nil
}

// open verifies an envelope: both checksums, where the file has them, over
// the data in compact form (the file may be indented for people).
func open(raw []byte) (*envelope, []byte, error) {
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, nil, err
	}
	if env.Version == "" || len(env.Data) == 0 {
		return nil, nil, fmt.Errorf("no version or no data")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, env.Data); err != nil {
		return nil, nil, err
	}
	data := compact.Bytes()
	if got := checksum(data); got != env.Checksum {
		return nil, nil, fmt.Errorf("checksum %s does not match its data (%s)", env.Checksum, got)
	}
	switch {
	case env.Sum != "":
		if got := sum(env.Version, data); got != env.Sum {
			return nil, nil, fmt.Errorf("sum %s does not match its version %q and data (%s)", env.Sum, env.Version, got)
		}
	case env.Version != V1:
		// Plugins before sum wrote v1 only: another version without a sum
		// is a damaged one.
		return nil, nil, fmt.Errorf("version %q has no sum; only %s files may lack one", env.Version, V1)
	}
	return &env, data, nil
}

// convert reads data written in version into the current State, and
// validates it.
func convert(version string, data []byte) (*State, error) {
	switch version {
	case V1, V2, V3:
		st := New()
		if err := json.Unmarshal(data, st); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if st.Claims == nil {
			st.Claims = map[types.UID]*Claim{}
		}
		if st.Generations == nil {
			st.Generations = map[string]int64{}
		}
		if version == V1 && st.fenced() {
			return nil, fmt.Errorf("%w: a %s file cannot hold fenced devices", ErrCorrupt, V1)
		}
		if version != V3 && st.adminAccess() {
			return nil, fmt.Errorf("%w: a %s file cannot hold devices with admin access", ErrCorrupt, version)
		}
		if err := st.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		return st, nil
	}
	if n, ok := versionNumber(version); ok && n > latest {
		return nil, fmt.Errorf("%w: version %q (this plugin reads up to %s); refusing to touch it", ErrNewerVersion, version, Version)
	}
	return nil, fmt.Errorf("%w: unknown version %q", ErrCorrupt, version)
}

// latest is Version's number.
var latest, _ = versionNumber(Version)

// versionNumber parses "v<n>".
func versionNumber(v string) (int, bool) {
	s, ok := strings.CutPrefix(v, "v")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// fenced reports whether any device is fenced.
func (st *State) fenced() bool { return st.anyDevice(func(d Device) bool { return d.Fenced }) }

// adminAccess reports whether any device has admin access.
func (st *State) adminAccess() bool {
	return st.anyDevice(func(d Device) bool { return d.AdminAccess })
}

// anyDevice reports whether a device of any claim satisfies f.
func (st *State) anyDevice(f func(Device) bool) bool {
	for _, c := range st.Claims {
		if c != nil && slices.ContainsFunc(c.Devices, f) {
			return true
		}
	}
	return false
}

// Encode serialises a state into checkpoint bytes: one line, the data as
// it was checksummed, in the oldest version that holds it. (Indenting it
// for people cost more than the rest of a save; jq shows it as well.)
// Files written indented by earlier versions decode the same.
func Encode(st *State) ([]byte, error) {
	data, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	version := V1
	switch {
	case st.adminAccess():
		version = V3
	case st.fenced():
		version = V2
	}
	head, err := json.Marshal(struct {
		Version  string `json:"version"`
		Checksum string `json:"checksum"`
		Sum      string `json:"sum"`
	}{version, checksum(data), sum(version, data)})
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	// {"version":…,"checksum":…,"sum":…,"data":<data>}
	out := make([]byte, 0, len(head)+len(data)+10)
	out = append(out, head[:len(head)-1]...)
	out = append(out, `,"data":`...)
	out = append(out, data...)
	out = append(out, "}\n"...)
	return out, nil
}
