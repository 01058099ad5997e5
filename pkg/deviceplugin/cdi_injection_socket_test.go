package deviceplugin

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// inject resolves CDI device names the way a container runtime does (the
// CNCF CDI library reading the spec directory) into an empty OCI spec, and
// returns the container's environment and device nodes.
func inject(t *testing.T, dir string, names ...string) (map[string]string, []string, error) {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, names...); err != nil {
		return nil, nil, err
	}
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	var devs []string
	for _, d := range spec.Linux.Devices {
		devs = append(devs, fmt.Sprintf("%s(%s %d:%d)", d.Path, d.Type, d.Major, d.Minor))
	}
	return env, devs, nil
}

func TestCDIInjectionWritesSpecTheRuntimeResolvesOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", seatsConfig)
	e.start(func(o *Options) {
		o.Injection = InjectionCDI
		o.NVIDIACDIDevice = func(index int, _ string) string { return fmt.Sprintf("nvidia.com/gpu=%d", index) }
	})
	resp, err := allocate(e, "kyb.ai/gpu-2x-seat", []string{"g45-2x-seat-1"})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.ContainerResponses[0]
	var names []string
	for _, d := range c.CdiDevices {
		names = append(names, d.Name)
	}
	// NVIDIA's entries of the group's GPUs for the driver files, then ours
	// (cdi.InjectionOrder: our variables win over NVIDIA's spec-level ones).
	if want := []string{"nvidia.com/gpu=4", "nvidia.com/gpu=5", "kyb.ai/gpu=dp-g45-2x-seat-1-gen-1"}; !slices.Equal(names, want) {
		t.Errorf("CDI devices %v, want %v", names, want)
	}
	if len(c.Envs) != 0 || len(c.Devices) != 0 || len(c.Mounts) != 0 {
		t.Errorf("CDI injection also returned envs %v, devices %v, mounts %v", c.Envs, c.Devices, c.Mounts)
	}

	ours := names[len(names)-1]
	env, devs, err := inject(t, e.cdiDir, ours)
	if err != nil {
		t.Fatalf("the runtime cannot resolve %s: %v", ours, err)
	}
	wantEnv := map[string]string{
		"CUDA_VISIBLE_DEVICES":   uuid4 + "," + uuid5,
		"NVIDIA_VISIBLE_DEVICES": uuid4 + "," + uuid5,
		"KYB_GPU_GROUP":          "G45",
		"KYB_GPU_SEAT":           "1",
		"KYB_SEAT_GEN":           "1",
	}
	for k, v := range wantEnv {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	// Majors: 195 for the NVIDIA devices, 511 for nvidia-uvm on the
	// simulated node.
	wantDevs := []string{"/dev/nvidia4(c 195:4)", "/dev/nvidia5(c 195:5)", "/dev/nvidiactl(c 195:255)", "/dev/nvidia-uvm(c 511:0)", "/dev/nvidia-uvm-tools(c 511:1)"}
	if !slices.Equal(devs, wantDevs) {
		t.Errorf("device nodes %v, want %v", devs, wantDevs)
	}

	// The seat handed out again: its spec is replaced, under a new name.
	resp, err = allocate(e, "kyb.ai/gpu-2x-seat", []string{"g45-2x-seat-1", "g45-2x-seat-2"})
	if err != nil {
		t.Fatal(err)
	}
	cds := resp.ContainerResponses[0].CdiDevices
	if got := cds[len(cds)-1].Name; got != "kyb.ai/gpu=dp-g45-2x-seat-1-gen-2" {
		t.Errorf("second hand-out: %s", got)
	}
	if env, _, err = inject(t, e.cdiDir, "kyb.ai/gpu=dp-g45-2x-seat-1-gen-2"); err != nil || env["KYB_GPU_SEAT"] != "1,2" || env["KYB_SEAT_GEN"] != "2,1" {
		t.Errorf("second hand-out resolves to %v, %v", env, err)
	}
	if _, _, err := inject(t, e.cdiDir, "kyb.ai/gpu=dp-g45-2x-seat-1-gen-1"); err == nil {
		t.Error("the first hand-out's name still resolves; its spec should have been replaced")
	}
	files, _ := os.ReadDir(e.cdiDir)
	var fileNames []string
	for _, f := range files {
		fileNames = append(fileNames, f.Name())
	}
	if want := []string{"kyb.ai-gpu_dp-g45-2x-seat-1.json"}; !slices.Equal(fileNames, want) {
		t.Errorf("CDI directory holds %v, want %v (one spec per first seat)", fileNames, want)
	}
}
