package draplugin_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
)

// Files in the CDI directory that carry the driver's prefix but name no
// claim UID are not the plugin's: it starts, serves and leaves them, and
// removes only the orphan spec of a claim it wrote.
func TestStartLeavesFilesItDoesNotOwn(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	c := e.claim(class1x)
	ids := e.prepareOK(c)
	e.stop()
	odd := []string{"kyb.ai-gpu_.json", "kyb.ai-gpu_a b.json", "kyb.ai-gpu_" + strings.Repeat("x", 200) + ".json"}
	for _, name := range odd {
		if err := os.WriteFile(filepath.Join(e.dirs.cdi, name), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	orphan := cdi.SpecName("00000000-dead-beef-0000-000000000000") + ".json"
	if err := os.WriteFile(filepath.Join(e.dirs.cdi, orphan), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.start()
	for _, name := range odd {
		if _, err := os.Stat(filepath.Join(e.dirs.cdi, name)); err != nil {
			t.Errorf("%s was touched: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dirs.cdi, orphan)); !os.IsNotExist(err) {
		t.Errorf("the orphan spec of a claim the plugin wrote stays: %v", err)
	}
	if again := e.prepareOK(c); strings.Join(again, " ") != strings.Join(ids, " ") {
		t.Errorf("after the restart the claim's CDI IDs are %v, were %v", again, ids)
	}
	if env, _ := e.container(e.prepareOK(e.claim(class1x))...); env["KYB_GPU_SEAT"] == "" {
		t.Errorf("a new claim after the restart: %v", env)
	}
}
