package nodesetup

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// A plugin in a container finds nvidia-cuda-mps-control among the host
// driver's tools under the driver root, and runs it with the driver's
// libraries and its other tools first on PATH.
func TestMPSControlFromTheDriverRoot(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	root := driverRoot(t)
	// The host's C library beside the driver's: the tool must not get it.
	if err := os.WriteFile(filepath.Join(root, "usr/lib/x86_64-linux-gnu/libc.so.6"), []byte("the host's"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "usr/bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// The driver's tool records the environment it runs with.
	script := "#!/bin/sh\necho \"PATH=$PATH LD_LIBRARY_PATH=$LD_LIBRARY_PATH\" >> \"$CUDA_MPS_LOG_DIRECTORY/env\"\nexec " + control + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "nvidia-cuda-mps-control"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, sharing: {strategy: mps}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := Flags{NodeName: "node-1", Simulate: "dgx-h100", ConfigPath: cfg, DriverRoot: root, DevRoot: "/", SysfsRoot: "/sys"}
	node, err := f.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close(ctx)
	t.Setenv("PATH", "/usr/bin:/bin") // no nvidia-cuda-mps-control on it
	s := SharingFlags{MPSRoot: t.TempDir(), MPSControl: "nvidia-cuda-mps-control", MPSShm: ShmSize{MiB: mps.DefaultShmTmpfsMiB}}
	pluginDir := t.TempDir()
	m, err := s.MPSManager(ctx, node, pluginDir, root, "boot-1")
	if err != nil {
		t.Fatal(err)
	}
	g := mps.Group{Name: "g0-1x", UUIDs: []string{node.Inv.GPUs[0].UUID}}
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{81559}))); err != nil {
		t.Fatalf("start the daemon with the driver's tool: %v", err)
	}
	defer func() { _ = m.Settle(ctx, g, mps.Unused()) }()
	env, err := os.ReadFile(filepath.Join(m.Dir("g0-1x"), mps.LogDir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	links := filepath.Join(pluginDir, "mps-driver")
	want := "PATH=" + filepath.Join(links, "bin") + ":/usr/bin:/bin LD_LIBRARY_PATH=" + filepath.Join(links, "lib")
	if line := strings.Split(strings.TrimSpace(string(env)), "\n")[0]; line != want {
		t.Errorf("the driver's tool ran with\n%s\nwant\n%s", line, want)
	}
	// Its library path holds the driver's libraries only.
	entries, err := os.ReadDir(filepath.Join(links, "lib"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "libcuda.so.1" {
		t.Errorf("LD_LIBRARY_PATH holds %v, want the driver's libcuda.so.1 only", names)
	}
	if target, err := os.Readlink(filepath.Join(links, "lib", "libcuda.so.1")); err != nil || target != filepath.Join(root, "usr/lib/x86_64-linux-gnu/libcuda.so.1") {
		t.Errorf("libcuda.so.1 leads to %q (%v), want the driver's", target, err)
	}
}

// The MPS control command: the operator's wins; without one, a real node
// runs the driver's and a simulated node, which has no driver, the
// simulated daemon of the binary that runs it, by its absolute path.
func TestMPSControlCommand(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := Flags{NodeName: "node-1", Simulate: "single-gpu", DriverRoot: "/", DevRoot: "/", SysfsRoot: "/sys"}
	simulated, err := f.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer simulated.Close(ctx)
	onGPU := &Node{Host: &gpuhost.Host{}}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		node    *Node
		flag    string
		want    []string
		wantErr string
	}{
		{"real node, no flag", onGPU, "", []string{"nvidia-cuda-mps-control"}, ""},
		{"simulated node, no flag", simulated, "", []string{self, "mps-control-sim"}, ""},
		{"simulated node, the operator's command", simulated, "chroot /run/nvidia/driver nvidia-cuda-mps-control", []string{"chroot", "/run/nvidia/driver", "nvidia-cuda-mps-control"}, ""},
		{"blank flag", onGPU, "  ", nil, `--mps-control "  " names no command, but a profile uses MPS`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := SharingFlags{MPSControl: tc.flag}
			got, err := s.control(tc.node)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("control %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}

// Both surfaces are handed the one Hardware the flags make: the node's
// inventory, its MPS daemons where a profile uses MPS (none otherwise),
// and the node's own time slices.
func TestHardwareIsTheNodesSharing(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		wantMPS       bool
	}{
		{"time slicing", "{resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, sharing: {timeSlicing: {interval: Long}}}", false},
		{"mps", "{resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4, sharing: {strategy: mps}}", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			cfg := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(cfg, []byte("profiles:\n- "+tc.profile+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			f := Flags{NodeName: "node-1", Simulate: "dgx-h100", ConfigPath: cfg, DevRoot: "/", SysfsRoot: "/sys"}
			node, err := f.Open(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer node.Close(ctx)
			s := SharingFlags{MPSRoot: t.TempDir(), MPSControl: "/bin/true", MPSShm: ShmSize{Unbounded: true}}
			hw, err := s.Hardware(ctx, node, t.TempDir(), "", "boot-1")
			if err != nil {
				t.Fatal(err)
			}
			if hw.Inv != node.Inv {
				t.Errorf("Hardware's inventory is not the node's")
			}
			if got := hw.MPS != nil; got != tc.wantMPS {
				t.Errorf("MPS daemons: %t, want %t", got, tc.wantMPS)
			}
			if err := hw.ApplyTimeSlice(ctx, node.Plan.Groups()[0]); err != nil {
				t.Fatal(err)
			}
			changes := node.Host.Simulated.SharingChanges()
			if got := slices.ContainsFunc(changes, func(c simnode.SharingChange) bool { return c.What == "timeSlice" && c.Value == "3" }); got == tc.wantMPS {
				t.Errorf("time slice set on the node: %t (changes %v), want %t", got, changes, !tc.wantMPS)
			}
		})
	}
}
