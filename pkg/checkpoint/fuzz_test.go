package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// A checkpoint file never crashes the plugin: it decodes to a state that
// survives a round trip, or is refused with a reason.
func FuzzDecode(f *testing.F) {
	raw, _ := Encode(sample())
	f.Add(raw)
	if fixture, err := os.ReadFile("testdata/checkpoint-v1.json"); err == nil {
		f.Add(fixture)
	}
	f.Add([]byte(`{"version":"v1","checksum":"sha256:00","data":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := Decode(data, "fuzz")
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("a rejection without a message")
			}
			return
		}
		again, err := Encode(st)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(again, "round trip")
		if err != nil || !reflect.DeepEqual(back, st) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// envelopeAround wraps data in an envelope with the right checksums, as a
// plugin (or a bug in one) would write it, so that fuzzing reaches the
// content behind the SHA-256.
func envelopeAround(version string, data []byte) []byte {
	var compact bytes.Buffer
	if json.Compact(&compact, data) != nil {
		compact.Reset()
		compact.Write(data)
	}
	d := compact.Bytes()
	return []byte(`{"version":"` + version + `","checksum":"` + checksum(d) + `","sum":"` + sum(version, d) + `","data":` + string(data) + `}`)
}

// Content whose checksums are right is decoded to a valid state or refused
// as corrupt with a reason, never trusted half-checked, never a panic.
func FuzzDecodeContent(f *testing.F) {
	raw, _ := Encode(sample())
	var env envelope
	_ = json.Unmarshal(raw, &env)
	f.Add([]byte(env.Data))
	f.Add([]byte(`{"claims":{"u":{"namespace":"a","name":"b","phase":"PrepareCompleted","devices":[{"requests":["r"],"pool":"p","device":"d","groupDevice":"d","gpus":[0,1],"gpuUUIDs":["x"],"seats":[0],"generations":[]}]}},"generations":{}}`))
	f.Add([]byte(`{"claims":{"u":null},"generations":{"d/0":-1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, version := range []string{V1, V2} {
			st, err := Decode(envelopeAround(version, data), "fuzz")
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("a content error that is not ErrCorrupt: %v", err)
				}
				continue
			}
			if err := st.Validate(); err != nil {
				t.Fatalf("decoded a state that does not validate: %v", err)
			}
			again, err := Encode(st)
			if err != nil {
				t.Fatal(err)
			}
			if back, err := Decode(again, "round trip"); err != nil || !reflect.DeepEqual(back, st) {
				t.Fatalf("round trip: %v", err)
			}
		}
	})
}
