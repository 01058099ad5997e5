package app

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// run runs the command with env as its environment. Unless env names one,
// the device-plugin directory is an empty one of the test's, so that a
// shim running on the test machine changes nothing.
func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	dp := t.TempDir()
	getenv := func(k string) string {
		if v, ok := env[k]; ok || k != "DEVICE_PLUGIN_DIRECTORY_PATH" {
			return v
		}
		return dp
	}
	code := Run(context.Background(), args, getenv, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestPlanTable(t *testing.T) {
	code, out, errOut := run(t, nil, "plan", "--simulate", "nvlink-2x4", "--config", "../../../api/kyb.ai/v1alpha1/testdata/seed-configmap.yaml")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"Node node-1: 8x NVIDIA A100-SXM4-80GB, driver 570.172.08, CUDA 12.8 (simulated: nvlink-2x4)",
		"GPU3  NV4   NV4   NV4   X     SYS",
		"1x       kyb.ai/gpu-1x-seat  1           4            8       32     no",
		"2x       kyb.ai/gpu-2x-seat  2           3            4       12     no",
		"g01-2x  G01    0,1   nvlink (NV4)  0     pci0000:00  3      config    g0-1x g1-1x",
		"g45-2x  G45    4,5   nvlink (NV4)  1     pci0000:80  3      topology  g4-1x g5-1x",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
}

// On a simulated DGX H200 the MIG geometry is the H200's, read through
// NVML: its smallest profile, 1g.18gb, gives seven seats per GPU.
func TestPlanMIGOnADGXH200(t *testing.T) {
	config := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(config, []byte("profiles:\n- {resource: kyb.ai/mig-1g.18gb, mig: {profile: 1g.18gb}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, nil, "plan", "--simulate", "dgx-h200", "--config", config)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"Node node-1: 8x NVIDIA H200, driver 580.159.04, CUDA 13.0 (simulated: dgx-h200)",
		"143771 MiB  hopper  9.0",
		"mig-1g-18gb  kyb.ai/mig-1g.18gb  1           7            8       56     no             mig 1g.18gb (GPUs 0,1,2,3,4,5,6,7)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = run(t, nil, "plan", "--simulate", "dgx-h200", "--config", config, "-o", "resourceslices")
	if n := strings.Count(out, "name: g7-mig-1g-18gb-"); code != 0 || n != 7 {
		t.Errorf("resourceslices: exit %d, %d MIG devices of GPU 7, want 7", code, n)
	}
}

func TestPlanMachineOutputs(t *testing.T) {
	code, out, _ := run(t, map[string]string{"KYB_SIMULATE": "dgx-h100"}, "plan", "-o", "json")
	if code != 0 || !strings.Contains(out, `"order": [`) || !strings.Contains(out, `"g0123-4x"`) {
		t.Errorf("json: exit %d\n%s", code, out)
	}
	code, out, _ = run(t, nil, "plan", "--simulate", "dgx-h100", "-o", "resourceslices")
	docs := strings.Split(out, "\n---\n")
	if code != 0 || len(docs) != 2 {
		t.Fatalf("resourceslices: exit %d, %d documents", code, len(docs))
	}
	var slice map[string]any
	if err := yaml.Unmarshal([]byte(docs[1]), &slice); err != nil {
		t.Fatal(err)
	}
	devices := slice["spec"].(map[string]any)["devices"].([]any)
	if len(devices) != 14 {
		t.Errorf("%d devices, want 14", len(devices))
	}
	code, out, _ = run(t, nil, "plan", "--simulate", "dgx-h100", "-o", "resourceslices", "--device-layout", "per-seat")
	if code != 0 || strings.Contains(out, "sharedCounters") || !strings.Contains(out, "g0123-4x-seat-0") {
		t.Errorf("per-seat resourceslices: exit %d\n%s", code, out)
	}
}

func TestCheckedInDeviceClassesAreCurrent(t *testing.T) {
	code, out, _ := run(t, nil, "plan", "--simulate", "dgx-h100", "-o", "deviceclasses")
	if code != 0 {
		t.Fatal(code)
	}
	file, err := os.ReadFile("../../../deployments/static/deviceclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(file), out) {
		t.Error("deployments/static/deviceclasses.yaml is stale; run make generate")
	}
}

func TestCommandLineErrorsSayWhatToFix(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("profiles:\n- resource: kyb.ai/gpu-1x-seat\n  seatsPerGroup: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A flat alias bomb: 100 KB repeated by 1,300 aliases.
	bomb := filepath.Join(dir, "bomb.yaml")
	if err := os.WriteFile(bomb, []byte("s: &s \""+strings.Repeat("x", 100_000)+"\"\nprofiles: ["+strings.Repeat("*s, ", 1299)+"*s]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"alias bomb", nil, []string{"plan", "--simulate", "dgx-h100", "--config", bomb}, 1, bomb + ": line 2: once its aliases are expanded the document grows beyond 4 MiB"},
		{"unknown flag", nil, []string{"plan", "--simulat", "x"}, 2, "flag provided but not defined: -simulat"},
		{"bad output", nil, []string{"plan", "-o", "xml"}, 2, `invalid value "xml" for flag -o: must be one of table, yaml, json, resourceslices, deviceclasses`},
		{"unknown preset", nil, []string{"plan", "--simulate", "dgx-z"}, 1, `unknown preset "dgx-z"; presets are dgx-a100, dgx-h100, dgx-h200, nvlink-2x4, pcie-8gpu, single-gpu, workstation-2gpu`},
		{"bad config", nil, []string{"plan", "--simulate", "dgx-h100", "--config", bad}, 1, bad + ":3: profiles[0].seatsPerGroup: must be at least 1, not 0"},
		{"missing config", nil, []string{"plan", "--simulate", "dgx-h100", "--config", filepath.Join(dir, "nope.yaml")}, 1, "read node configuration"},
		{"bad env", map[string]string{"KYB_DEVICE_LAYOUT": "sideways"}, []string{"--node-name", "n"}, 2, `environment variable KYB_DEVICE_LAYOUT="sideways": must be one of auto, shared, per-seat`},
		{"no node name", nil, []string{"--simulate", "dgx-h100"}, 2, "--node-name (or NODE_NAME) is required"},
		{"bad port", nil, []string{"--node-name", "n", "--healthcheck-port", "70000"}, 2, "--healthcheck-port 70000 is not a port"},
		{"no cluster", nil, []string{"--node-name", "n", "--simulate", "dgx-h100"}, 1, "no --kubeconfig given and not running in a cluster"},
		{"bad kubeconfig", nil, []string{"--node-name", "n", "--kubeconfig", filepath.Join(dir, "nope")}, 1, "read kubeconfig"},
		{"stray argument", nil, []string{"plan", "extra"}, 2, `unexpected argument "extra"`},
		{"relative plugin directory", nil, []string{"--node-name", "n", "--kubelet-plugins-directory-path", ""}, 2, `--kubelet-plugins-directory-path "" must be an absolute path`},
		{"relative CDI root in env", map[string]string{"CDI_ROOT": "cdi"}, []string{"--node-name", "n"}, 2, `--cdi-root "cdi" must be an absolute path`},
		{"faults without a simulated node", map[string]string{"KYB_SIMULATE_FAULTS_FILE": "/tmp/faults"}, []string{"--node-name", "n"}, 2, "--simulate-faults-file needs --simulate"},
		{"MPS shm of 0", nil, []string{"--node-name", "n", "--mps-shm-size-mib", "0"}, 2, `invalid value "0" for flag -mps-shm-size-mib: 0 would leave each MPS daemon's shm directory unbounded on the host's disk: give a size in MiB, or "unbounded" to mean that`},
		{"MPS shm of 0 in env", map[string]string{"KYB_MPS_SHM_SIZE_MIB": "0"}, []string{"--node-name", "n"}, 2, `environment variable KYB_MPS_SHM_SIZE_MIB="0": 0 would leave each MPS daemon's shm directory unbounded`},
		{"MPS shm not a size", nil, []string{"--node-name", "n", "--mps-shm-size-mib", "1Gi"}, 2, `invalid value "1Gi" for flag -mps-shm-size-mib: want a size in MiB or "unbounded"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := run(t, tc.env, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d (want %d), stderr:\n%s\nwant it to say %q", code, tc.code, errOut, tc.want)
			}
		})
	}
}

func TestFlagWinsOverEnvironment(t *testing.T) {
	code, out, _ := run(t, map[string]string{"KYB_SIMULATE": "dgx-h100"}, "plan", "--simulate", "single-gpu")
	if code != 0 || !strings.Contains(out, "1x NVIDIA L4") {
		t.Errorf("exit %d, output %s", code, out)
	}
}

func TestHelp(t *testing.T) {
	code, _, errOut := run(t, nil, "-h")
	if code != 0 || !strings.Contains(errOut, "-kubelet-plugins-directory-path") || !strings.Contains(errOut, "(env KUBELET_PLUGINS_DIRECTORY_PATH)") {
		t.Errorf("help: exit %d\n%s", code, errOut)
	}
}

func TestDRAPluginRefusesBesideALiveShimButNotAStaleSocket(t *testing.T) {
	dir := sockettest.Dir(t)
	sockettest.Stale(t, filepath.Join(dir, "kyb-gpu-2x-seat.sock"))
	// A stale socket (a crashed shim) does not stop the DRA plugin: it gets
	// as far as looking for its cluster.
	if code, _, out := run(t, nil, "--node-name", "n", "--device-plugin-directory-path", dir); code != 1 || !strings.Contains(out, "no --kubeconfig given") {
		t.Errorf("stale shim socket: exit %d\n%s", code, out)
	}
	live := filepath.Join(dir, "kyb-gpu-1x-seat.sock")
	sockettest.Listen(t, live)
	code, _, out := run(t, map[string]string{"DEVICE_PLUGIN_DIRECTORY_PATH": dir}, "--node-name", "n")
	if code != 1 || !strings.Contains(out, "the kyb device-plugin shim serves this node ("+live+" answers): a node runs the DRA plugin or the shim, never both") {
		t.Errorf("live shim socket: exit %d\n%s", code, out)
	}
}

// A configuration whose pool takes more slices than the chart's admission
// policy allows a node is refused where it is planned, not slice by slice
// by the API server: eight overprovisioned 1x profiles of 128 seats, one
// device per seat, are 8,192 devices in 128 slices.
func TestPlanRefusesAPoolLargerThanTheAdmissionPolicyAllows(t *testing.T) {
	var cfg strings.Builder
	cfg.WriteString("profiles:\n")
	for i := range 8 {
		fmt.Fprintf(&cfg, "- {name: p%d, resource: kyb.ai/gpu-1x-seat-%d, gpusPerGroup: 1, seatsPerGroup: 128, allowOverprovision: true}\n", i, i)
	}
	config := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(config, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, nil, "plan", "--simulate", "dgx-h100", "--config", config, "-o", "resourceslices", "--device-layout", "per-seat")
	if code == 0 || !strings.Contains(errOut, "takes 128 ResourceSlices (8192 devices), more than the 120") {
		t.Errorf("exit %d, stderr %q; want a refusal naming 128 slices against the bound of 120", code, errOut)
	}
	if code, _, errOut := run(t, nil, "plan", "--simulate", "dgx-h100", "--config", config, "-o", "resourceslices"); code != 0 {
		t.Errorf("shared layout, a device per group: exit %d: %s", code, errOut)
	}
}
