package deviceplugin

import (
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
)

// The simulated dgx-h100's GPU UUIDs (simnode.DeriveUUID of node-1).
const (
	uuid4 = "GPU-83b0fa7d-64c3-ca7c-3f7d-b295858051fe"
	uuid5 = "GPU-152c1c87-b77f-b578-2191-32c13c9c7d30"
	uuid6 = "GPU-07576c18-9374-8c98-9fb5-5c40a9ca2c5a"
	uuid7 = "GPU-6b66bdb1-af22-9c52-f40f-a0e34ddca8d9"
)

func allocate(e *env, resource string, containers ...[]string) (*pluginapi.AllocateResponse, error) {
	req := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	return e.kubelet.client(resource).Allocate(e.ctx, req)
}

// renderEnv writes a container's environment as sorted "K=V" lines.
func renderEnv(envs map[string]string) string {
	var out []string
	for k, v := range envs {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func renderDevices(specs []*pluginapi.DeviceSpec) string {
	var out []string
	for _, d := range specs {
		out = append(out, d.HostPath+"->"+d.ContainerPath+":"+d.Permissions)
	}
	return strings.Join(out, " ")
}

const controlDevices = "/dev/nvidiactl->/dev/nvidiactl:rw /dev/nvidia-uvm->/dev/nvidia-uvm:rw /dev/nvidia-uvm-tools->/dev/nvidia-uvm-tools:rw"

func TestAllocateGivesEachContainerItsEnvAndDeviceSpecsOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", seatsConfig)
	e.start(func(o *Options) {
		o.Edits.Driver = &containeredits.DriverFiles{Root: "/", HostRoot: "/", Libraries: []containeredits.DriverFile{{Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Name: "libcuda.so.1", Library: true}}}
	})

	resp, err := allocate(e, "kyb.ai/gpu-1x-seat",
		[]string{"g6-1x-seat-1", "g6-1x-seat-0", "g6-1x-seat-1"}, // two seats of G6, one named twice
		[]string{"g7-1x-seat-0"},
	)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.MarshalIndent(resp, "", "  ")
	t.Logf("AllocateResponse for [g6-1x-seat-1 g6-1x-seat-0 g6-1x-seat-1] [g7-1x-seat-0]:\n%s", js)
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("%d container responses, want 2", len(resp.ContainerResponses))
	}
	want := []struct{ env, devices string }{
		{
			env:     "CUDA_VISIBLE_DEVICES=" + uuid6 + "\nKYB_GPU_GROUP=G6,G6\nKYB_GPU_SEAT=0,1\nKYB_SEAT_GEN=1,1\nNVIDIA_VISIBLE_DEVICES=" + uuid6,
			devices: "/dev/nvidia6->/dev/nvidia6:rw " + controlDevices,
		},
		{
			env:     "CUDA_VISIBLE_DEVICES=" + uuid7 + "\nKYB_GPU_GROUP=G7\nKYB_GPU_SEAT=0\nKYB_SEAT_GEN=1\nNVIDIA_VISIBLE_DEVICES=" + uuid7,
			devices: "/dev/nvidia7->/dev/nvidia7:rw " + controlDevices,
		},
	}
	for i, w := range want {
		c := resp.ContainerResponses[i]
		if got := renderEnv(c.Envs); got != w.env {
			t.Errorf("container %d env:\n%s\nwant:\n%s", i, got, w.env)
		}
		if got := renderDevices(c.Devices); got != w.devices {
			t.Errorf("container %d devices:\n %s\nwant %s", i, got, w.devices)
		}
		if len(c.Mounts) != 2 || c.Mounts[0].ContainerPath != "/usr/lib/x86_64-linux-gnu/libcuda.so.1" || c.Mounts[1].ContainerPath != "/usr/lib64/libcuda.so.1" || c.Mounts[0].HostPath != "/usr/lib/x86_64-linux-gnu/libcuda.so.1" || !c.Mounts[0].ReadOnly {
			t.Errorf("container %d mounts: %v", i, c.Mounts)
		}
		if len(c.CdiDevices) != 0 {
			t.Errorf("container %d: CDI devices %v with env injection", i, c.CdiDevices)
		}
	}

	// A 2x seat sees both GPUs of its group.
	resp, err = allocate(e, "kyb.ai/gpu-2x-seat", []string{"g45-2x-seat-2"})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.ContainerResponses[0]
	if got, w := renderEnv(c.Envs), "CUDA_VISIBLE_DEVICES="+uuid4+","+uuid5+"\nKYB_GPU_GROUP=G45\nKYB_GPU_SEAT=2\nKYB_SEAT_GEN=1\nNVIDIA_VISIBLE_DEVICES="+uuid4+","+uuid5; got != w {
		t.Errorf("2x env:\n%s\nwant:\n%s", got, w)
	}
	if got, w := renderDevices(c.Devices), "/dev/nvidia4->/dev/nvidia4:rw /dev/nvidia5->/dev/nvidia5:rw "+controlDevices; got != w {
		t.Errorf("2x devices:\n %s\nwant %s", got, w)
	}

	// Seats of two groups in one container: both GPUs, one entry per seat.
	// A seat handed out again has its next generation.
	resp, err = allocate(e, "kyb.ai/gpu-1x-seat", []string{"g7-1x-seat-1", "g6-1x-seat-0"})
	if err != nil {
		t.Fatal(err)
	}
	if got, w := renderEnv(resp.ContainerResponses[0].Envs), "CUDA_VISIBLE_DEVICES="+uuid6+","+uuid7+"\nKYB_GPU_GROUP=G6,G7\nKYB_GPU_SEAT=0,1\nKYB_SEAT_GEN=2,1\nNVIDIA_VISIBLE_DEVICES="+uuid6+","+uuid7; got != w {
		t.Errorf("two groups:\n%s\nwant:\n%s", got, w)
	}
}

func TestAllocateRejectsUnknownIDsOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", seatsConfig)
	e.start()
	tests := []struct {
		name       string
		containers [][]string
		want       []string
	}{
		{"no such seat", [][]string{{"g6-1x-seat-9"}}, []string{`unknown device "g6-1x-seat-9"`, "kyb.ai/gpu-1x-seat"}},
		{"seat of another resource", [][]string{{"g45-2x-seat-0"}}, []string{`unknown device "g45-2x-seat-0"`, "kyb.ai/gpu-1x-seat"}},
		{"second container bad", [][]string{{"g6-1x-seat-0"}, {"g6-1x-seat-0", "GPU-0"}}, []string{"container request 1", `unknown device "GPU-0"`}},
		{"empty", [][]string{{}}, []string{"no devices of kyb.ai/gpu-1x-seat requested"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := allocate(e, "kyb.ai/gpu-1x-seat", tc.containers...)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("error %q does not say %q", status.Convert(err).Message(), w)
				}
			}
		})
	}
	// The rejected requests handed nothing out: g6-1x-seat-0 is at its
	// first generation.
	resp, err := allocate(e, "kyb.ai/gpu-1x-seat", []string{"g6-1x-seat-0"})
	if err != nil {
		t.Fatal(err)
	}
	if gen := resp.ContainerResponses[0].Envs["KYB_SEAT_GEN"]; gen != "1" {
		t.Errorf("KYB_SEAT_GEN=%s after rejected requests, want 1", gen)
	}
}

func TestConcurrentAllocateCountsEveryHandOutOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", seatsConfig)
	e.start()
	const calls = 100
	seats := []string{"g6-1x-seat-0", "g6-1x-seat-1", "g7-1x-seat-0", "g7-1x-seat-1"}
	var mu sync.Mutex
	gens := map[string][]int{}
	var wg sync.WaitGroup
	for i := 0; i < calls; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := seats[i%len(seats)]
			resp, err := allocate(e, "kyb.ai/gpu-1x-seat", []string{id})
			if err != nil {
				t.Errorf("Allocate %s: %v", id, err)
				return
			}
			gen, err := strconv.Atoi(resp.ContainerResponses[0].Envs["KYB_SEAT_GEN"])
			if err != nil {
				t.Errorf("KYB_SEAT_GEN: %v", err)
				return
			}
			mu.Lock()
			gens[id] = append(gens[id], gen)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	// Each seat was handed out 25 times: generations 1..25, each once.
	var want []int
	for g := 1; g <= calls/len(seats); g++ {
		want = append(want, g)
	}
	for _, id := range seats {
		got := gens[id]
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: generations %v, want 1..%d once each", id, got, calls/len(seats))
		}
	}
}
