package bootid

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		path    string
		want    string
		wantErr string
	}{
		{"the kernel's form", write("kernel", "0b7f6c1e-61d4-4c38-9a5e-3c8d3f1e2a90\n"), "0b7f6c1e-61d4-4c38-9a5e-3c8d3f1e2a90", ""},
		{"a test's", write("test", "boot-2"), "boot-2", ""},
		{"empty", write("empty", "\n"), "", "is empty"},
		{"missing", filepath.Join(dir, "missing"), "", "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Read(tt.path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "boot ID") {
					t.Fatalf("Read = %q, %v; want an error about the boot ID saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Read = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
