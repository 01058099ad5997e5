package durablefile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var testFormat = Format{Kind: "test file", Latest: "v2"}

type content struct {
	N int `json:"n"`
}

// decode reads a test file: its envelope, then its content.
func decode(raw []byte, path string) (content, error) {
	_, data, err := testFormat.Open(raw, path)
	if err != nil {
		return content{}, err
	}
	var c content
	if err := json.Unmarshal(data, &c); err != nil {
		return content{}, errors.Join(ErrCorrupt, err)
	}
	return c, nil
}

func seal(t *testing.T, f Format, version string, c content) []byte {
	t.Helper()
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.Seal(version, data)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// The envelope's bytes, computed here by hand: a file written by an
// earlier writer of the same kind verifies the same.
func TestSealWritesTheEnvelope(t *testing.T) {
	raw := seal(t, testFormat, "v1", content{N: 7})
	data := `{"n":7}`
	h := sha256.Sum256([]byte(data))
	s := sha256.Sum256([]byte("kyb.ai test file v1\n" + data))
	want := `{"version":"v1","checksum":"sha256:` + hex.EncodeToString(h[:]) + `","sum":"sha256:` + hex.EncodeToString(s[:]) + `","data":` + data + "}\n"
	if string(raw) != want {
		t.Fatalf("sealed:\n%s\nwant\n%s", raw, want)
	}
	version, got, err := testFormat.Open(raw, "x")
	if err != nil || version != "v1" || string(got) != data {
		t.Fatalf("Open = %q %s %v", version, got, err)
	}
}

func TestOpenRefusesWhatDoesNotVerify(t *testing.T) {
	good := seal(t, testFormat, "v1", content{N: 7})
	data := []byte(`{"n":7}`)
	other := Format{Kind: "other file", Latest: "v2"}
	tests := map[string][]byte{
		"a flipped bit in the data":    bytes.Replace(good, []byte(`"n":7`), []byte(`"n":6`), 1),
		"a flipped bit in the version": bytes.Replace(good, []byte(`"v1"`), []byte(`"v2"`), 1),
		"truncated":                    good[:len(good)-5],
		"empty":                        nil,
		"garbage":                      []byte("\x00\x17not json at all"),
		"no sum":                       []byte(`{"version":"v1","checksum":"` + Checksum(data) + `","data":{"n":7}}`),
		"another kind of file":         seal(t, other, "v1", content{N: 7}),
		"no data":                      []byte(`{"version":"v1","checksum":"","sum":""}`),
	}
	for name, raw := range tests {
		t.Run(name, func(t *testing.T) {
			if _, _, err := testFormat.Open(raw, "x"); !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNewerVersion) {
				t.Fatalf("Open = %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestOpenTellsANewerFileFromADamagedOne(t *testing.T) {
	if _, _, err := testFormat.Open(seal(t, testFormat, "v3", content{}), "x"); !errors.Is(err, ErrNewerVersion) {
		t.Errorf("a verified v3 file: %v, want ErrNewerVersion", err)
	}
	unsummed := Format{Kind: "test file", Latest: "v2", Unsummed: "v1"}
	data := []byte(`{"n":7}`)
	if _, _, err := unsummed.Open([]byte(`{"version":"v1","checksum":"`+Checksum(data)+`","data":{"n":7}}`), "x"); err != nil {
		t.Errorf("an unsummed v1 file of a format that allows one: %v", err)
	}
	if _, _, err := unsummed.Open([]byte(`{"version":"v3","checksum":"`+Checksum(data)+`","data":{"n":7}}`), "x"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("an unsummed v3 file: %v, want ErrCorrupt (only v1 files lack a sum)", err)
	}
}

func TestLoadFallsBackToThePreviousCopy(t *testing.T) {
	dir := t.TempDir()
	f := New(dir, "state.json")
	if _, res, err := Load(f, decode); err != nil || !res.Fresh {
		t.Fatalf("no file: %+v %v, want fresh", res, err)
	}
	for n := 1; n <= 2; n++ {
		if err := f.Save(seal(t, testFormat, "v1", content{N: n})); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if old, _ := filepath.Glob(filepath.Join(dir, "*.old")); len(old) != 0 {
		t.Errorf("copies put aside are left after Sync: %v", old)
	}
	if c, res, err := Load(f, decode); err != nil || res.RecoveredFrom != nil || c.N != 2 {
		t.Fatalf("Load = %+v %+v %v, want the second save", c, res, err)
	}
	good, _ := os.ReadFile(f.Path())
	for name, bad := range map[string][]byte{"truncated": good[:len(good)-3], "empty": nil, "garbage": []byte("}{")} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(f.Path(), bad, 0o600); err != nil {
				t.Fatal(err)
			}
			c, res, err := Load(f, decode)
			if err != nil || !errors.Is(res.RecoveredFrom, ErrCorrupt) || c.N != 1 {
				t.Fatalf("Load = %+v %+v %v, want the previous copy, recovered from a corrupt file", c, res, err)
			}
		})
	}
	if err := os.WriteFile(f.PrevPath(), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(f, decode); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("both copies bad: %v, want ErrCorrupt", err)
	}
	moved, err := f.Quarantine(func(raw []byte, path string) bool { _, err := decode(raw, path); return err == nil })
	if err != nil || len(moved) != 2 {
		t.Fatalf("Quarantine = %v %v, want both copies set aside", moved, err)
	}
	for _, p := range moved {
		if !strings.Contains(p, ".corrupt-") {
			t.Errorf("set aside as %s", p)
		}
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the copy set aside is gone: %v", err)
		}
	}
	if _, res, err := Load(f, decode); err != nil || !res.Fresh {
		t.Fatalf("after the quarantine: %+v %v, want fresh", res, err)
	}
}

func TestLoadStopsAtANewerFile(t *testing.T) {
	f := New(t.TempDir(), "state.json")
	if err := os.WriteFile(f.PrevPath(), seal(t, testFormat, "v3", content{}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Path(), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(f, decode); !errors.Is(err, ErrNewerVersion) {
		t.Fatalf("a damaged file beside a newer previous copy: %v, want ErrNewerVersion", err)
	}
}
