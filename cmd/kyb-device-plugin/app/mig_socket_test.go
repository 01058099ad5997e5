package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/deviceplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// TestShimCommandServesMIGSeatsOverRealSockets: the command gives the
// shim NVML, mig-minors and the journal's directory, so that a 1g.10gb
// seat's Allocate makes its instance.
func TestShimCommandServesMIGSeatsOverRealSockets(t *testing.T) {
	dir := sockettest.Dir(t)
	dp, plugins := filepath.Join(dir, "dp"), filepath.Join(dir, "plugins")
	kubelet := kubeletPodResources(t)
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte("profiles:\n- {resource: kyb.ai/gpu-1x-seat}\n- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 2}, gpus: [0]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var code int
	var errOut string
	wg.Add(1)
	go func() {
		defer wg.Done()
		code, errOut = runShimCommand(ctx, map[string]string{"KYB_SIMULATE": "dgx-h100", "KYB_CONFIG": config, "KUBELET_PLUGINS_DIRECTORY_PATH": plugins, "POD_RESOURCES_SOCKET": kubelet.Socket},
			"--device-plugin-directory-path", dp)
	}()
	stop := func() {
		cancel()
		wg.Wait()
	}
	socket := filepath.Join(dp, deviceplugin.SocketName("kyb.ai/mig-1g.10gb"))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("no socket %s; exit %d, stderr:\n%s", socket, code, errOut)
		}
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pluginapi.NewDevicePluginClient(conn).Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"g0-mig-1g-10gb-6"}}},
	})
	if err != nil {
		stop()
		t.Fatalf("Allocate: %v; stderr:\n%s", err, errOut)
	}
	env := resp.ContainerResponses[0].Envs
	if !strings.HasPrefix(env["CUDA_VISIBLE_DEVICES"], "MIG-") || env["KYB_GPU_SEAT"] != "6" {
		t.Errorf("container env %v, want a MIG device at seat 6", env)
	}
	journal, err := os.ReadFile(filepath.Join(driver.PluginDir(plugins), miginstance.JournalFile))
	if err != nil || !strings.Contains(string(journal), `"device":"g0-mig-1g-10gb-6"`) || !strings.Contains(string(journal), env["CUDA_VISIBLE_DEVICES"]) {
		t.Errorf("journal %s (%v), want the seat's instance", journal, err)
	}
	stop()
	if code != 0 {
		t.Errorf("exit %d, stderr:\n%s", code, errOut)
	}
}
