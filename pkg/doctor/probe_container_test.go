package doctor

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdisandbox"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

// TestProbeNeedsWhatAContainerHas runs the probe over the stand-in
// libcuda, as root, in the sandbox of a seat's spec: a container as runc
// builds one, where it sees the seat's GPU; and that container short of
// one thing a real container has, where it fails as the real libcuda.so.1
// failed on a GPU in a sandbox without it: to load without libm, and in
// cuInit with CUDA_ERROR_OPERATING_SYSTEM (304) without procfs, sysfs or
// /dev/null.
func TestProbeNeedsWhatAContainerHas(t *testing.T) {
	n, inv := probeNode(t)
	spec := filepath.Join(t.TempDir(), "kyb.ai-gpu_probe.json")
	n.write(spec, `{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu","devices":[{"name":"seat","containerEdits":{
		"env":["NVIDIA_VISIBLE_DEVICES=`+inv.GPUs[0].UUID+`"],
		"deviceNodes":[{"path":"/dev/nvidia0"},{"path":"/dev/nvidiactl"}],
		"mounts":[{"hostPath":"`+filepath.Join(n.opts.Node.DriverRoot, "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05")+`","containerPath":"/usr/lib/x86_64-linux-gnu/libcuda.so.1","options":["ro","bind"]}]}}]}`)
	e := &examination{opts: n.opts}
	opts := cdisandbox.Options{Specs: []string{spec}, Devices: []string{"kyb.ai/gpu=seat"}, Program: n.opts.Probe.Program, BaseEnv: imageEnv, HostPath: e.seenPath}
	noMount := func(target string) func(*sandbox.Config) {
		return func(cfg *sandbox.Config) {
			cfg.Mounts = slices.DeleteFunc(cfg.Mounts, func(m sandbox.Mount) bool { return m.Target == target })
		}
	}
	tests := []struct {
		name   string
		remove func(*sandbox.Config)
		// want is the probe's error; "": it sees GPU 0 and allocates.
		want string
	}{
		{name: "a container as runc builds one", remove: func(*sandbox.Config) {}},
		{name: "no libm", remove: func(cfg *sandbox.Config) {
			cfg.Binds = slices.DeleteFunc(cfg.Binds, func(b sandbox.Bind) bool { return filepath.Base(b.Target) == "libm.so.6" })
		}, want: "dlopen libcuda.so.1: libm.so.6: cannot open shared object file: No such file or directory"},
		{name: "no /proc", remove: noMount("/proc"), want: "cuInit: CUDA error 304"},
		{name: "no /sys", remove: noMount("/sys"), want: "cuInit: CUDA error 304"},
		{name: "no /dev/null", remove: func(cfg *sandbox.Config) {
			cfg.Nodes = slices.DeleteFunc(cfg.Nodes, func(n sandbox.Node) bool { return n.Path == "/dev/null" })
		}, want: "cuInit: CUDA error 304"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := cdisandbox.Plan(opts)
			if err != nil {
				t.Fatal(err)
			}
			before := len(cfg.Targets())
			tt.remove(cfg)
			if tt.want != "" && len(cfg.Targets()) != before-1 {
				t.Fatalf("removed %d paths from the sandbox, want 1", before-len(cfg.Targets()))
			}
			out, err := cdisandbox.RunConfig(context.Background(), opts.Program, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var r cudaprobe.Result
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			saw, allocated := probeSaw(&r)
			switch {
			case tt.want == "" && (r.Error != "" || !slices.Equal(saw, []string{inv.GPUs[0].UUID}) || !allocated):
				t.Errorf("the probe saw %v (allocated on each: %v), error %q; want exactly %s, allocated", saw, allocated, r.Error, inv.GPUs[0].UUID)
			case tt.want != "" && !strings.Contains(r.Error, tt.want):
				t.Errorf("the probe's error is %q, want %q", r.Error, tt.want)
			}
		})
	}
}
