package checkpoint

import (
	"encoding/json"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/durablefile"
)

// format is the checkpoint's envelope (package durablefile): v1 files
// were written before sum.
var format = durablefile.Format{Kind: "checkpoint", Latest: Version, Unsummed: V1}

// Decode parses and verifies checkpoint bytes; name is used in errors.
// Every error wraps ErrCorrupt, except ErrNewerVersion for a file that a
// newer plugin verifiably wrote.
func Decode(raw []byte, name string) (*State, error) {
	version, data, err := format.Open(raw, name)
	if err != nil {
		return nil, err
	}
	st, err := convert(version, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return st, nil
}

// convert reads data written in version into the current State, and
// validates it.
func convert(version string, data []byte) (*State, error) {
	switch version {
	case V1, V2, V3, V4:
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
		if (version == V1 || version == V2) && st.adminAccess() {
			return nil, fmt.Errorf("%w: a %s file cannot hold devices with admin access", ErrCorrupt, version)
		}
		if version != V4 && st.sized() {
			return nil, fmt.Errorf("%w: a %s file cannot hold sized seats", ErrCorrupt, version)
		}
		if err := st.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		return st, nil
	}
	return nil, fmt.Errorf("%w: unknown version %q", ErrCorrupt, version)
}

// fenced reports whether any device is fenced.
func (st *State) fenced() bool { return st.anyDevice(func(d Device) bool { return d.Fenced }) }

// adminAccess reports whether any device has admin access.
func (st *State) adminAccess() bool {
	return st.anyDevice(func(d Device) bool { return d.AdminAccess })
}

// sized reports whether any device holds a sized seat.
func (st *State) sized() bool { return st.anyDevice(func(d Device) bool { return d.Size != nil }) }

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
	case st.sized():
		version = V4
	case st.adminAccess():
		version = V3
	case st.fenced():
		version = V2
	}
	out, err := format.Seal(version, data)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	return out, nil
}
