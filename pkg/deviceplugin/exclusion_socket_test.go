package deviceplugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

func TestRefusesToStartBesideALiveDRAPluginOverRealSockets(t *testing.T) {
	for _, name := range []string{"dra.sock", "dra-0b7e3c1a-2f4d-4e8a-9c6b-5d1f2a3b4c5d.sock"} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, "dgx-h100", "")
			sock := filepath.Join(e.pluginsDir, "gpu.kyb.ai", name)
			sockettest.Listen(t, sock)
			_, err := e.tryStart()
			if err == nil || !strings.Contains(err.Error(), "the kyb DRA plugin serves this node ("+sock+" answers)") {
				t.Fatalf("start beside a live DRA plugin: %v", err)
			}
			if entries, _ := os.ReadDir(e.dir); len(entries) != 0 {
				t.Errorf("a refused start left %d files in the device-plugin directory", len(entries))
			}
		})
	}
}

func TestStaleDRASocketDoesNotBlockStartOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	sockettest.Stale(t, filepath.Join(e.pluginsDir, "gpu.kyb.ai", "dra.sock"))
	e.start()
}

func TestRefusesASecondShimOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	e.start()
	_, err := e.tryStart()
	if err == nil || !strings.Contains(err.Error(), "another kyb device-plugin shim serves this node") {
		t.Fatalf("second shim: %v", err)
	}
	// The first one still serves.
	if _, err := allocate(e, "kyb.ai/gpu-1x-seat", []string{"g6-1x-seat-0"}); err != nil {
		t.Errorf("first shim after the refused second: %v", err)
	}
}

// The DRA plugin's check sees the shim's own sockets: a stale one or
// another vendor's live one does not count, a running shim does.
func TestDRAPluginSeesARunningShimOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	if err := driver.CheckNoLiveShim(filepath.Join(e.dir, "missing")); err != nil {
		t.Errorf("missing directory: %v", err)
	}
	sockettest.Stale(t, filepath.Join(e.dir, "kyb-gpu-1x-seat.sock"))
	sockettest.Listen(t, filepath.Join(e.dir, "nvidia-gpu.sock"))
	if err := driver.CheckNoLiveShim(e.dir); err != nil {
		t.Errorf("stale shim socket and another vendor's live one: %v", err)
	}
	e.start()
	err := driver.CheckNoLiveShim(e.dir)
	if err == nil || !strings.Contains(err.Error(), "the kyb device-plugin shim serves this node ("+filepath.Join(e.dir, "kyb-gpu-1x-seat.sock")) {
		t.Errorf("live shim: %v", err)
	}
	e.plugin.Stop()
	if err := driver.CheckNoLiveShim(e.dir); err != nil {
		t.Errorf("after the shim stopped: %v", err)
	}
}
