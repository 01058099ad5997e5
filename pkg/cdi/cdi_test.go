package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

func TestWriteListRemove(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	edits := &containeredits.Edits{Env: []string{"KYB_GPU_GROUP=G0"}, DeviceNodes: []containeredits.DeviceNode{{Path: "/dev/nvidia0", HostPath: "/dev/nvidia0", Major: 195}}}
	for _, uid := range []string{"b-uid", "a-uid"} {
		if err := w.Write(types.UID("uid-"+uid), []Device{{Name: "g0-1x", Edits: edits}}); err != nil {
			t.Fatal(err)
		}
	}
	odd := []string{"kyb.ai-gpu_.json", "kyb.ai-gpu_a b.json", "kyb.ai-gpu_" + strings.Repeat("x", 200) + ".json"}
	for _, name := range append([]string{"nvidia.com-gpu.yaml"}, odd...) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	claims, skipped, err := w.Claims()
	if err != nil || len(claims) != 2 || claims[0] != "uid-a-uid" || claims[1] != "uid-b-uid" {
		t.Fatalf("claims %v %v", claims, err)
	}
	slices.Sort(odd)
	if slices.Sort(skipped); !slices.Equal(skipped, odd) {
		t.Errorf("skipped %v, want the files with the driver's prefix and no claim UID: %v", skipped, odd)
	}
	if !w.Exists("uid-a-uid") {
		t.Error("written spec does not exist")
	}
	if err := w.Remove("uid-a-uid"); err != nil || w.Exists("uid-a-uid") {
		t.Errorf("remove: %v", err)
	}
	if err := w.Remove("uid-a-uid"); err != nil {
		t.Errorf("removing a missing spec: %v", err)
	}
	if got := DeviceID("uid-b-uid", "g0-1x"); got != "kyb.ai/gpu=uid-b-uid-g0-1x" {
		t.Errorf("device ID %s", got)
	}
	// One version whatever the claim's UID: a device name that starts
	// with a digit alone would need 0.5.0.
	for _, uid := range []types.UID{"u", "0u"} {
		spec, err := Spec(uid, []Device{{Name: "d", Edits: edits}})
		if err != nil || spec.Version != SpecVersion {
			t.Errorf("claim %s: spec version %q, want %s: %v", uid, spec.Version, SpecVersion, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, SpecName("uid-b-uid")+specExt)); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("spec file mode %v (%v), want -rw-r--r--", fi.Mode(), err)
	}
	if err := w.Write("bad", []Device{{Name: "d", Edits: &containeredits.Edits{}}}); err == nil {
		t.Error("a device with no edits must be refused")
	}
}

func TestFindNVIDIADevices(t *testing.T) {
	dir := t.TempDir()
	gpus := []inventory.GPU{{Index: 0, UUID: "GPU-aaaa"}, {Index: 1, UUID: "GPU-bbbb"}}
	_, ctx := ktesting.NewTestContext(t)
	if _, err := FindNVIDIADevices(ctx, []string{dir}, gpus); err == nil {
		t.Error("no spec must be an error")
	}
	spec := `cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: GPU-bbbb
  containerEdits: {deviceNodes: [{path: /dev/nvidia1}]}
- name: all
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
`
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := FindNVIDIADevices(ctx, []string{dir}, gpus)
	if err != nil || got[0] != "nvidia.com/gpu=0" || got[1] != "nvidia.com/gpu=GPU-bbbb" {
		t.Errorf("found %v %v", got, err)
	}
}

func TestUnsafeClaimUIDsNeverReachAPath(t *testing.T) {
	w, err := NewWriter(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	edits := &containeredits.Edits{Env: []string{"A=1"}}
	for _, uid := range []types.UID{"../../etc/x", "a/b", "", ".hidden", "a..b"} {
		if err := w.Write(uid, []Device{{Name: "d", Edits: edits}}); err == nil {
			t.Errorf("Write(%q) accepted an unsafe UID", uid)
		}
		if err := w.Remove(uid); err == nil {
			t.Errorf("Remove(%q) accepted an unsafe UID", uid)
		}
	}
}

// ReadEnv is what a lost checkpoint is rebuilt from: a spec it cannot
// read is there all the same (ok, with an error), never taken for none.
func TestReadEnv(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	edits := &containeredits.Edits{Env: []string{"KYB_GPU_GROUP=G0", "KYB_GPU_SEAT=2"}, DeviceNodes: []containeredits.DeviceNode{{Path: "/dev/nvidia0", HostPath: "/dev/nvidia0", Major: 195}}}
	if err := w.Write("uid-a", []Device{{Name: "g0-1x-s", Edits: edits}}); err != nil {
		t.Fatal(err)
	}
	env, ok, err := w.ReadEnv("uid-a")
	if err != nil || !ok || env["g0-1x-s"]["KYB_GPU_SEAT"] != "2" || env["g0-1x-s"]["KYB_GPU_GROUP"] != "G0" {
		t.Errorf("read back %v, %v, %v", env, ok, err)
	}
	if _, ok, err := w.ReadEnv("uid-none"); ok || err != nil {
		t.Errorf("no spec: ok %v, %v", ok, err)
	}
	path := func(uid types.UID) string { return filepath.Join(dir, SpecName(uid)+specExt) }
	if err := os.WriteFile(path("uid-torn"), []byte(`{"cdiVersion":`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path("uid-other"), []byte(`{"cdiVersion":"0.3.0","kind":"example.com/gpu","devices":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path("uid-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for uid, want := range map[types.UID]string{"uid-torn": "unexpected end", "uid-other": `kind "example.com/gpu"`, "uid-dir": "is a directory"} {
		if _, ok, err := w.ReadEnv(uid); !ok || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: ok %v, %v; want ok and an error saying %q", uid, ok, err, want)
		}
	}
}

// Injected as the plugins order them, our device's GPUs survive NVIDIA's
// spec-level NVIDIA_VISIBLE_DEVICES=void; in the other order they would
// not (checked too, so the test can tell the difference).
func TestInjectionOrderKeepsOurVisibleDevices(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	edits := &containeredits.Edits{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-aaaa"}, DeviceNodes: []containeredits.DeviceNode{{Path: "/dev/nvidia0", HostPath: "/dev/nvidia0", Major: 195}}}
	if err := w.Write("uid-a", []Device{{Name: "g0", Edits: edits}}); err != nil {
		t.Fatal(err)
	}
	nvidia := "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}\ncontainerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(nvidia), 0o644); err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	visible := func(ids []string) string {
		spec := &ocispec.Spec{Process: &ocispec.Process{}}
		if _, err := cache.InjectDevices(spec, ids...); err != nil {
			t.Fatalf("inject %v: %v", ids, err)
		}
		var v string
		for _, e := range spec.Process.Env {
			if val, ok := strings.CutPrefix(e, "NVIDIA_VISIBLE_DEVICES="); ok {
				v = val
			}
		}
		return v
	}
	ours := DeviceID("uid-a", "g0")
	if got := visible(InjectionOrder(ours, []string{"nvidia.com/gpu=0"})); got != "GPU-aaaa" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q in the plugins' order, want GPU-aaaa", got)
	}
	if got := visible([]string{ours, "nvidia.com/gpu=0"}); got != "void" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q with ours first; the runtime's order is not as assumed", got)
	}
}
