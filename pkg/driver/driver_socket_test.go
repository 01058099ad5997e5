package driver

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// listen serves a unix socket at path that accepts and closes connections
// until the test ends.
func listen(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil {
				_ = c.Close()
			}
		}
	}()
}

// staleSocket leaves a socket file at path that nobody listens on, as a
// crashed process does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = lis.Close()
}

func TestCheckNoLiveDRAOverRealSockets(t *testing.T) {
	tests := []struct {
		name    string
		live    []string // relative to the kubelet's plugin directory
		stale   []string
		wantErr string
	}{
		{name: "nothing there"},
		{name: "stale socket", stale: []string{"gpu.kyb.ai/dra.sock"}},
		{name: "another driver's live socket", live: []string{"gpu.nvidia.com/dra.sock"}},
		{name: "live socket", live: []string{"gpu.kyb.ai/dra.sock"}, wantErr: "gpu.kyb.ai/dra.sock answers"},
		{name: "live rolling-update socket", live: []string{"gpu.kyb.ai/dra-0b7e3c1a.sock"}, wantErr: "gpu.kyb.ai/dra-0b7e3c1a.sock answers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "kyb-driver-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			for _, p := range tt.live {
				listen(t, filepath.Join(dir, p))
			}
			for _, p := range tt.stale {
				staleSocket(t, filepath.Join(dir, p))
			}
			err = CheckNoLiveDRA(dir)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("CheckNoLiveDRA: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "the kyb DRA plugin serves this node")):
				t.Fatalf("CheckNoLiveDRA: %v, want an error naming %q", err, tt.wantErr)
			}
		})
	}
}

func TestCheckNoLiveShimOverRealSockets(t *testing.T) {
	tests := []struct {
		name    string
		live    []string // relative to the kubelet's device-plugin directory
		stale   []string
		wantErr string
	}{
		{name: "nothing there"},
		{name: "stale socket", stale: []string{"kyb-gpu-1x-seat.sock"}},
		{name: "another vendor's live socket", live: []string{"nvidia-gpu.sock"}},
		{name: "live socket", live: []string{"kyb-gpu-1x-seat.sock"}, wantErr: "kyb-gpu-1x-seat.sock answers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "kyb-driver-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			for _, p := range tt.live {
				listen(t, filepath.Join(dir, p))
			}
			for _, p := range tt.stale {
				staleSocket(t, filepath.Join(dir, p))
			}
			err = CheckNoLiveShim(dir)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("CheckNoLiveShim: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "the kyb device-plugin shim serves this node")):
				t.Fatalf("CheckNoLiveShim: %v, want an error naming %q", err, tt.wantErr)
			}
		})
	}
	if err := CheckNoLiveShim(filepath.Join(os.TempDir(), "kyb-driver-missing-dir")); err != nil {
		t.Errorf("missing directory: %v", err)
	}
}
