package app

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/doctor"
	"github.com/kyb-ai/kyb-dra-driver/pkg/fifotest"
)

// TestDoctorCommand runs the doctor as the chart's init container does:
// the plugin's environment, then its exit code and JSON.
func TestDoctorCommand(t *testing.T) {
	root := t.TempDir()
	env := map[string]string{
		"KYB_SIMULATE":                     "dgx-h100",
		"NODE_NAME":                        "node-1",
		"CDI_ROOT":                         filepath.Join(root, "cdi"),
		"KUBELET_PLUGINS_DIRECTORY_PATH":   filepath.Join(root, "plugins"),
		"KUBELET_REGISTRAR_DIRECTORY_PATH": filepath.Join(root, "registry"),
		"KYB_HOST_ROOT":                    root,
	}
	for _, d := range []string{"cdi", "plugins", "registry", "etc/containerd"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	config := "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"" + env["CDI_ROOT"] + "\"]\n"
	if err := os.WriteFile(filepath.Join(root, "etc/containerd/config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, env, "doctor", "-o", "json")
	var report struct {
		Node   string         `json:"node"`
		Counts map[string]int `json:"counts"`
		Checks []struct{ Name, Status string }
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != 0 {
		t.Fatalf("exit %d, %v: %s %s", code, err, out, errOut)
	}
	if report.Node != "node-1" || report.Counts["ok"] != len(report.Checks) || len(report.Checks) < 10 {
		t.Errorf("report: %+v", report)
	}

	// A broken node exits 1 and says why on stdout, for kubectl logs.
	env["KUBELET_REGISTRAR_DIRECTORY_PATH"] = filepath.Join(root, "nowhere")
	code, out, _ = run(t, env, "doctor")
	if code != 1 || !strings.Contains(out, "kubelet       fail") || !strings.Contains(out, "node node-1: 10 ok, 0 warn, 1 fail") {
		t.Errorf("broken node: exit %d\n%s", code, out)
	}
	env["KYB_DOCTOR_REPORT_ONLY"] = "true"
	if code, out, _ = run(t, env, "doctor"); code != 0 || !strings.Contains(out, "1 fail") {
		t.Errorf("broken node, report only: exit %d\n%s", code, out)
	}
}

// TestDoctorCheckTimeoutFlag: a check whose read never returns (the
// containerd configuration is a FIFO) fails after --check-timeout, and
// the doctor reports the rest.
func TestDoctorCheckTimeoutFlag(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"cdi", "plugins", "registry"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(root, "etc/containerd/config.toml")
	fifotest.Make(t, config)
	t.Cleanup(func() { fifotest.Release(t, config) })
	var code int
	var out string
	if !fifotest.Returns(t, 30*time.Second, func() {
		code, out, _ = run(t, nil, "doctor", "--simulate", "dgx-h100", "--node-name", "node-1", "--cdi-root", filepath.Join(root, "cdi"),
			"--kubelet-plugins-directory-path", filepath.Join(root, "plugins"), "--kubelet-registrar-directory-path", filepath.Join(root, "registry"),
			"--host-root", root, "--check-timeout", "1s")
	}, config) {
		t.Fatalf("the doctor with --check-timeout 1s blocked reading %s, a FIFO", config)
	}
	if code != 1 || !strings.Contains(out, "runtime-cdi   fail    not finished within 1s (--check-timeout)") || !strings.Contains(out, "node node-1: 10 ok, 0 warn, 1 fail") {
		t.Errorf("exit %d\n%s", code, out)
	}
}

func TestDoctorRefusesBadFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"doctor", "--probe-claim", "x"}, "--probe-binary, --probe-claim, --probe-group and --probe-timeout need --probe"},
		{[]string{"doctor", "--probe-timeout", "10s"}, "--probe-timeout need --probe"},
		{[]string{"doctor", "--probe", "--probe-binary", "/bin/sh", "--probe-timeout", "0s"}, "--probe-timeout 0s must be positive"},
		{[]string{"doctor", "--probe", "--probe-timeout", "soon"}, `invalid value "soon" for flag -probe-timeout`},
		{[]string{"doctor", "--probe", "--probe-binary", "/nonexistent/kyb-cuda-probe"}, "--probe-binary: stat /nonexistent/kyb-cuda-probe"},
		{[]string{"doctor", "--probe", "--probe-binary", "/bin/sh", "--probe-claim", "x", "--probe-group", "G0"}, "exclude each other"},
		{[]string{"doctor", "--cdi-root", "relative"}, `--cdi-root "relative" must be an absolute path`},
		{[]string{"doctor", "-o", "yaml"}, "must be one of table, json"},
		{[]string{"doctor", "--check-timeout", "0s"}, "--check-timeout 0s must be positive"},
	} {
		code, _, errOut := run(t, nil, tt.args...)
		if code != 2 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d %q, want 2 with %q", tt.args, code, errOut, tt.want)
		}
	}
}

// TestProbeTimeoutFlag: the probe is bounded by default, and by what
// --probe-timeout says.
func TestProbeTimeoutFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"--probe", "--probe-binary", "/bin/sh"}, doctor.DefaultProbeTimeout},
		{[]string{"--probe", "--probe-binary", "/bin/sh", "--probe-timeout", "90s"}, 90 * time.Second},
	} {
		var stderr bytes.Buffer
		f := cli.NewFlagSet("kyb-dra-plugin doctor", &stderr)
		var p probeFlags
		p.addFlags(f)
		if err := f.Parse(tt.args, func(string) string { return "" }); err != nil {
			t.Fatalf("%v: %v %s", tt.args, err, stderr.String())
		}
		opts, err := p.options()
		if err != nil || opts.Timeout != tt.want {
			t.Errorf("%v: %+v %v, want timeout %s", tt.args, opts, err, tt.want)
		}
	}
	if doctor.DefaultProbeTimeout != time.Minute {
		t.Errorf("default probe timeout %s, docs/doctor.md says 1m", doctor.DefaultProbeTimeout)
	}
}
