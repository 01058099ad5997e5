package cdisandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

func writeSpec(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kyb.ai-gpu_c1.json")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPlanAppliesEditsAsARuntimeDoes: the spec's edits, then the device's,
// later values of a variable winning; device nodes bound where the host
// has them and made from their numbers where not; read-only mounts kept
// read-only; hooks listed, not run.
func TestPlanAppliesEditsAsARuntimeDoes(t *testing.T) {
	host := t.TempDir()
	lib := filepath.Join(host, "libcuda.so.1")
	if err := os.WriteFile(lib, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	spec := writeSpec(t, `{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu",
		"containerEdits":{"env":["A=spec","B=spec"],"hooks":[{"hookName":"createContainer","path":"/usr/bin/nvidia-cdi-hook"}]},
		"devices":[{"name":"c1-seat","containerEdits":{
			"env":["B=device"],
			"deviceNodes":[{"path":"/dev/nvidia0","hostPath":"/dev/nvidia0"},{"path":"/dev/nvidia1","major":195,"minor":1}],
			"mounts":[{"hostPath":"/lib/libcuda.so.1","containerPath":"/usr/local/nvidia/lib64/libcuda.so.1","options":["ro","bind"]}]}}]}`)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	hostPath := func(p string) string {
		if p == "/dev/nvidia0" || p == "/lib/libcuda.so.1" {
			return filepath.Join(host, filepath.Base(p))
		}
		return filepath.Join(host, "missing", p)
	}
	if err := os.WriteFile(filepath.Join(host, "nvidia0"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Plan(Options{Specs: []string{spec}, Devices: []string{"kyb.ai/gpu=c1-seat"}, Program: self, BaseEnv: []string{"A=image", "PATH=/bin"}, HostPath: hostPath})
	if err != nil {
		t.Fatal(err)
	}
	from := "CDI device kyb.ai/gpu=c1-seat in " + spec
	if want := []string{"PATH=/bin", "A=spec", "B=device"}; !slices.Equal(cfg.Env, want) {
		t.Errorf("env %v, want %v", cfg.Env, want)
	}
	if !slices.Contains(cfg.Binds, sandbox.Bind{Source: filepath.Join(host, "nvidia0"), Target: "/dev/nvidia0", From: from}) {
		t.Errorf("/dev/nvidia0 is not bound from the host: %+v", cfg.Binds)
	}
	// After a container's own nodes, as runc makes a spec's after them.
	if len(cfg.Nodes) == 0 || cfg.Nodes[len(cfg.Nodes)-1] != (sandbox.Node{Path: "/dev/nvidia1", Major: 195, Minor: 1, From: from}) ||
		!slices.ContainsFunc(cfg.Nodes, func(n sandbox.Node) bool { return n.Path == "/dev/null" }) {
		t.Errorf("nodes %+v, want a container's, then /dev/nvidia1 made from 195:1", cfg.Nodes)
	}
	if !slices.Contains(cfg.Binds, sandbox.Bind{Source: lib, Target: "/usr/local/nvidia/lib64/libcuda.so.1", ReadOnly: true, From: from}) {
		t.Errorf("libcuda is not mounted read-only: %+v", cfg.Binds)
	}
	if cfg.Binds[0].Target != sandbox.ProgramPath || len(cfg.Hooks) != 1 || !strings.Contains(cfg.Hooks[0], "nvidia-cdi-hook") {
		t.Errorf("program bind %+v, hooks %v", cfg.Binds[0], cfg.Hooks)
	}
}

func TestPlanRefusesWhatCannotBeBuilt(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spec := writeSpec(t, `{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu","devices":[{"name":"c1-seat","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia-nowhere"}]}}]}`)
	for _, tt := range []struct {
		device, want string
	}{
		{"kyb.ai/gpu=c1-seat", "/dev/nvidia-nowhere does not exist and the spec gives no numbers"},
		{"kyb.ai/gpu=c2-seat", "CDI device kyb.ai/gpu=c2-seat is in none of"},
	} {
		if _, err := Plan(Options{Specs: []string{spec}, Devices: []string{tt.device}, Program: self}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.device, err, tt.want)
		}
	}
}

// TestPlanRefusesPathsOutsideTheRoot: a spec is input that may be hostile.
// A container path that is not clean and absolute would not name a place
// inside the sandbox's root as written, and the program's own path is not
// the spec's to bind over; each is refused before anything is built,
// naming the spec entry and the path.
func TestPlanRefusesPathsOutsideTheRoot(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, edits, want string
	}{
		{"a mount climbing out", `"mounts":[{"hostPath":"/lib/libc.so.6","containerPath":"/../../../tmp/x/planted"}]`,
			`: mount of "/lib/libc.so.6" at "/../../../tmp/x/planted": refused: "/../../../tmp/x/planted" is not a clean path`},
		{"a device node climbing out", `"deviceNodes":[{"path":"/dev/../../tmp/x/node","major":1,"minor":3}]`,
			`: device node "/dev/../../tmp/x/node": refused: "/dev/../../tmp/x/node" is not a clean path`},
		{"a relative device node", `"deviceNodes":[{"path":"dev/nvidia0","major":195,"minor":0}]`,
			`: device node "dev/nvidia0": refused: "dev/nvidia0" is not an absolute path`},
		{"a relative host path", `"mounts":[{"hostPath":"lib/libcuda.so.1","containerPath":"/usr/lib/libcuda.so.1"}]`,
			`refused: host path "lib/libcuda.so.1" is not absolute`},
		{"a mount over the program", `"mounts":[{"hostPath":"/bin/sh","containerPath":"/probe"}]`,
			`refused: /probe is where the sandbox has the program it runs`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// In the device's edits and in the spec's, for every device.
			for _, where := range []string{"device", "spec"} {
				device, common := `{`+tt.edits+`}`, `{"env":["X=1"]}`
				wantFrom := "CDI device kyb.ai/gpu=c1-seat in "
				if where == "spec" {
					device, common = common, device
					wantFrom = "CDI spec "
				}
				spec := writeSpec(t, `{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu","containerEdits":`+common+`,"devices":[{"name":"c1-seat","containerEdits":`+device+`}]}`)
				_, err := Plan(Options{Specs: []string{spec}, Devices: []string{"kyb.ai/gpu=c1-seat"}, Program: self})
				if err == nil || !strings.HasPrefix(err.Error(), wantFrom) || !strings.Contains(err.Error(), spec) ||
					!strings.Contains(err.Error(), tt.want) || !errors.Is(err, sandbox.ErrRefused) {
					t.Errorf("%s edits: %v, want %q from %q", where, err, tt.want, wantFrom+spec)
				}
			}
		})
	}
}

// TestPlanLeavesAContainersNodesOutOfADevTheSpecBinds: a directory a spec
// binds at /dev is the container's /dev, in which runc makes none of a
// container's own nodes; the spec's nodes are still made.
func TestPlanLeavesAContainersNodesOutOfADevTheSpecBinds(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dev := t.TempDir()
	for _, tt := range []struct {
		name, mounts string
		want         []string
	}{
		{name: "a directory at /dev/gpus", mounts: `{"hostPath":"` + dev + `","containerPath":"/dev/gpus"}`,
			want: []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/nvidia1"}},
		{name: "a directory at /dev", mounts: `{"hostPath":"` + dev + `","containerPath":"/dev","options":["rbind"]}`,
			want: []string{"/dev/nvidia1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := writeSpec(t, `{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu","devices":[{"name":"c1-seat","containerEdits":{
				"deviceNodes":[{"path":"/dev/nvidia1","hostPath":"/nonexistent/nvidia1","major":195,"minor":1}],"mounts":[`+tt.mounts+`]}}]}`)
			cfg, err := Plan(Options{Specs: []string{spec}, Devices: []string{"kyb.ai/gpu=c1-seat"}, Program: self})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range cfg.Nodes {
				got = append(got, n.Path)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("nodes %v, want %v", got, tt.want)
			}
		})
	}
}
