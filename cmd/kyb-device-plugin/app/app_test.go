package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

func runShimCommand(ctx context.Context, env map[string]string, args ...string) (int, string) {
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string { return env[k] }
	code := Run(ctx, args, getenv, &stdout, &stderr)
	return code, stderr.String()
}

// kubeletPodResources serves the kubelet's PodResources API for a shim
// command, with no pod.
func kubeletPodResources(t *testing.T) *podresourcestest.Server {
	return podresourcestest.Start(t, filepath.Join(sockettest.Dir(t), "pod-resources.sock"))
}

func TestDevicePluginCommandLineErrorsSayWhatToFix(t *testing.T) {
	dir := sockettest.Dir(t)
	sockettest.Listen(t, filepath.Join(dir, "plugins", "gpu.kyb.ai", "dra.sock"))
	// The DRA plugin is gone from another node, its pod still running.
	drained := kubeletPodResources(t)
	drained.SetPodResources(&podresourcesapi.PodResources{Namespace: "team-a", Name: "trainer", Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", DynamicResources: []*podresourcesapi.DynamicResource{{ClaimName: "gpus", ClaimNamespace: "team-a",
			ClaimResources: []*podresourcesapi.ClaimResource{{DriverName: driver.Name, PoolName: "node-1", DeviceName: "g01-2x"}}}},
	}}})
	other := filepath.Join(dir, "other")
	mps := filepath.Join(dir, "mps.yaml")
	if err := os.WriteFile(mps, []byte("profiles:\n- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, sharing: {strategy: mps}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"unknown flag", nil, []string{"--injections", "cdi"}, 2, "flag provided but not defined: -injections"},
		{"bad injection", nil, []string{"--injection", "annotations"}, 2, `invalid value "annotations" for flag -injection: must be one of envvar, cdi`},
		{"bad injection in env", map[string]string{"KYB_INJECTION": "volume-mounts"}, nil, 2, `environment variable KYB_INJECTION="volume-mounts": must be one of envvar, cdi`},
		{"bad driver files", nil, []string{"--driver-files", "all"}, 2, `invalid value "all" for flag -driver-files: must be one of auto, nvidia-cdi, driver-root, none`},
		{"relative device-plugin dir", nil, []string{"--device-plugin-directory-path", "device-plugins"}, 2, `--device-plugin-directory-path "device-plugins" must be an absolute path`},
		{"relative dir in env", map[string]string{"DEVICE_PLUGIN_DIRECTORY_PATH": "dp/"}, nil, 2, `--device-plugin-directory-path "dp/" must be an absolute path`},
		{"relative CDI root", nil, []string{"--cdi-root", "cdi"}, 2, `--cdi-root "cdi" must be an absolute path`},
		{"pod name without its namespace", nil, []string{"--pod-name", "shim-x"}, 2, "--pod-name and --pod-namespace go together"},
		{"zero poll interval", nil, []string{"--pod-resources-poll-interval", "0s"}, 2, `--pod-resources-poll-interval 0s must be positive`},
		{"relative pod resources socket", nil, []string{"--pod-resources-socket", "kubelet.sock"}, 2, `--pod-resources-socket "kubelet.sock" must be an absolute path`},
		{"nvidia-cdi without CDI injection", nil, []string{"--driver-files", "nvidia-cdi"}, 2, "--driver-files=nvidia-cdi needs --injection=cdi"},
		{"stray argument", nil, []string{"serve"}, 2, `unexpected argument "serve"`},
		{"faults without a simulated node", nil, []string{"--simulate-faults-file", "/tmp/faults"}, 2, "--simulate-faults-file needs --simulate"},
		{"MPS shm of 0", nil, []string{"--mps-shm-size-mib", "0"}, 2, `invalid value "0" for flag -mps-shm-size-mib: 0 would leave each MPS daemon's shm directory unbounded on the host's disk: give a size in MiB, or "unbounded" to mean that`},
		{"negative MPS shm in env", map[string]string{"KYB_MPS_SHM_SIZE_MIB": "-1"}, nil, 2, `environment variable KYB_MPS_SHM_SIZE_MIB="-1": want a positive size in MiB or "unbounded"`},
		{"unknown preset", nil, []string{"--simulate", "dgx-z"}, 1, `unknown preset "dgx-z"`},
		{"pods of the DRA plugin hold GPUs", map[string]string{"POD_RESOURCES_SOCKET": drained.Socket}, []string{"--simulate", "dgx-h100", "--device-plugin-directory-path", filepath.Join(other, "dp"), "--kubelet-plugins-directory-path", filepath.Join(other, "plugins")}, 1,
			"pods still hold GPUs the kyb DRA plugin prepared (team-a/trainer container app: claim team-a/gpus)"},
		{"no kubelet to ask", map[string]string{"POD_RESOURCES_SOCKET": filepath.Join(dir, "nope.sock")}, []string{"--simulate", "dgx-h100", "--device-plugin-directory-path", filepath.Join(other, "dp"), "--kubelet-plugins-directory-path", filepath.Join(other, "plugins")}, 1,
			"ask the kubelet whether pods of the kyb DRA plugin still hold this node's GPUs"},
		{"MPS without the kubelet", nil, []string{"--pod-resources-socket", "", "--simulate", "dgx-h100", "--config", mps, "--device-plugin-directory-path", filepath.Join(other, "dp"), "--kubelet-plugins-directory-path", filepath.Join(other, "plugins")}, 1,
			"--pod-resources-socket is empty, and MPS needs the kubelet's PodResources API"},
		{"beside a live DRA plugin", nil, []string{"--simulate", "dgx-h100", "--device-plugin-directory-path", filepath.Join(dir, "dp"), "--kubelet-plugins-directory-path", filepath.Join(dir, "plugins")}, 1,
			"the kyb DRA plugin serves this node (" + filepath.Join(dir, "plugins", "gpu.kyb.ai", "dra.sock") + " answers)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, errOut := runShimCommand(context.Background(), tc.env, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d (want %d), stderr:\n%s\nwant it to say %q", code, tc.code, errOut, tc.want)
			}
			if tc.code == 2 && strings.Count(strings.TrimSpace(errOut), "\n") > 1 {
				t.Errorf("a bad flag should get a short message, not:\n%s", errOut)
			}
		})
	}
}

func TestDevicePluginHelp(t *testing.T) {
	code, errOut := runShimCommand(context.Background(), nil, "-h")
	for _, want := range []string{
		"Usage: kyb-device-plugin",
		"-device-plugin-directory-path", "(env DEVICE_PLUGIN_DIRECTORY_PATH)",
		"-injection", "(env KYB_INJECTION)",
		"-config", "(env KYB_CONFIG)",
		"-cdi-root", "(env CDI_ROOT)",
		"-kubelet-plugins-directory-path",
		"-pod-resources-socket", "(env POD_RESOURCES_SOCKET)",
		"-mps-control", "(env KYB_MPS_CONTROL)",
		"-mps-pipe-read-only", "(env KYB_MPS_PIPE_READ_ONLY)",
		"-mps-shm-size-mib", "(env KYB_MPS_SHM_SIZE_MIB) (default 256)",
		"-simulate-faults-file", "(env KYB_SIMULATE_FAULTS_FILE)", "xid GPU XID",
		"-v value",
	} {
		if code != 0 || !strings.Contains(errOut, want) {
			t.Errorf("help: exit %d, lacks %q", code, want)
		}
	}
}

func TestDevicePluginServesUntilSignalledAndRemovesItsSocketsOverRealSockets(t *testing.T) {
	dir := sockettest.Dir(t)
	dp := filepath.Join(dir, "dp")
	kubelet := kubeletPodResources(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var code int
	var errOut string
	wg.Add(1)
	go func() {
		defer wg.Done()
		code, errOut = runShimCommand(ctx, map[string]string{"KYB_SIMULATE": "dgx-h100", "KUBELET_PLUGINS_DIRECTORY_PATH": filepath.Join(dir, "plugins"), "POD_RESOURCES_SOCKET": kubelet.Socket},
			"--device-plugin-directory-path", dp, "--injection", "cdi", "--cdi-root", filepath.Join(dir, "cdi"))
	}()
	sockets := []string{"kyb-gpu-1x-seat.sock", "kyb-gpu-2x-seat.sock", "kyb-gpu-4x-seat.sock"}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range sockets {
		for {
			if _, err := os.Stat(filepath.Join(dp, s)); err == nil {
				break
			}
			if time.Now().After(deadline) {
				cancel()
				wg.Wait()
				t.Fatalf("no socket %s; exit %d, stderr:\n%s", s, code, errOut)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// While it runs, the DRA plugin's check refuses to start on this node.
	if err := driver.CheckNoLiveShim(dp); err == nil || !strings.Contains(err.Error(), "the kyb device-plugin shim serves this node ("+filepath.Join(dp, "kyb-gpu-1x-seat.sock")) {
		t.Errorf("DRA plugin's check beside the shim: %v", err)
	}

	cancel() // SIGTERM
	wg.Wait()
	if code != 0 {
		t.Errorf("exit %d after the signal, stderr:\n%s", code, errOut)
	}
	for _, s := range sockets {
		if _, err := os.Stat(filepath.Join(dp, s)); !os.IsNotExist(err) {
			t.Errorf("socket %s after shutdown: %v", s, err)
		}
	}
	// Once the shim is gone, the DRA plugin gets past the check.
	if err := driver.CheckNoLiveShim(dp); err != nil {
		t.Errorf("DRA plugin's check after the shim stopped: %v", err)
	}
}
