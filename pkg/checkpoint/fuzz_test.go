package checkpoint

import (
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
