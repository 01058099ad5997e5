package driver

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// Each surface's check over real unix sockets: only a socket that answers
// counts, a stale file or another driver's socket does not.
func TestCheckNoLiveOverRealSockets(t *testing.T) {
	const draSays, shimSays = "the kyb DRA plugin serves this node", "the kyb device-plugin shim serves this node"
	tests := []struct {
		name    string
		check   func(dir string) error
		live    []string // relative to the directory checked
		stale   []string
		wantErr string
	}{
		{name: "DRA: nothing there", check: CheckNoLiveDRA},
		{name: "DRA: stale socket", check: CheckNoLiveDRA, stale: []string{"gpu.kyb.ai/dra.sock"}},
		{name: "DRA: another driver's live socket", check: CheckNoLiveDRA, live: []string{"gpu.nvidia.com/dra.sock"}},
		{name: "DRA: live socket", check: CheckNoLiveDRA, live: []string{"gpu.kyb.ai/dra.sock"}, wantErr: draSays + " (%s/gpu.kyb.ai/dra.sock answers)"},
		{name: "DRA: live rolling-update socket", check: CheckNoLiveDRA, live: []string{"gpu.kyb.ai/dra-0b7e3c1a.sock"}, wantErr: draSays + " (%s/gpu.kyb.ai/dra-0b7e3c1a.sock answers)"},
		{name: "shim: nothing there", check: CheckNoLiveShim},
		{name: "shim: stale socket", check: CheckNoLiveShim, stale: []string{"kyb-gpu-1x-seat.sock"}},
		{name: "shim: another vendor's live socket", check: CheckNoLiveShim, live: []string{"nvidia-gpu.sock"}},
		{name: "shim: live socket", check: CheckNoLiveShim, live: []string{"kyb-gpu-1x-seat.sock"}, wantErr: shimSays + " (%s/kyb-gpu-1x-seat.sock answers)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := sockettest.Dir(t)
			for _, p := range tt.live {
				sockettest.Listen(t, filepath.Join(dir, p))
			}
			for _, p := range tt.stale {
				sockettest.Stale(t, filepath.Join(dir, p))
			}
			err := tt.check(dir)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("check: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), strings.Replace(tt.wantErr, "%s", dir, 1))):
				t.Fatalf("check: %v, want an error saying %q", err, strings.Replace(tt.wantErr, "%s", dir, 1))
			}
		})
	}
}

func TestCheckOfAMissingDirectoryPasses(t *testing.T) {
	missing := filepath.Join(sockettest.Dir(t), "missing")
	if err := CheckNoLiveShim(missing); err != nil {
		t.Errorf("CheckNoLiveShim: %v", err)
	}
	if err := CheckNoLiveDRA(missing); err != nil {
		t.Errorf("CheckNoLiveDRA: %v", err)
	}
}
