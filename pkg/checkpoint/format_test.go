package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
)

// The file's bytes, computed here by hand as plugins before package
// durablefile wrote them: a rollback reads what this plugin writes.
func TestOnDiskFormatIsUnchanged(t *testing.T) {
	data, err := json.Marshal(sample())
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(data)
	s := sha256.Sum256(append([]byte("kyb.ai checkpoint v1\n"), data...))
	want := `{"version":"v1","checksum":"sha256:` + hex.EncodeToString(h[:]) + `","sum":"sha256:` + hex.EncodeToString(s[:]) + `","data":` + string(data) + "}\n"
	got, err := Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("encoded:\n%s\nwant\n%s", got, want)
	}
}
