package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// fakePodResources is the kubelet's PodResources API over a real unix
// socket, listing the assignments the test says the kubelet holds.
type fakePodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	sock string

	mu       sync.Mutex
	srv      *grpc.Server
	held     map[string][]string // "pod/container" -> device IDs
	resource string
	lists    int
	// self is a pod without devices listed beside the others (the
	// shim's own); amnesiac lists no pod at all, as a kubelet that has
	// just started does.
	self     string
	amnesiac bool
}

func newFakePodResources(t *testing.T, dir, resource string) *fakePodResources {
	f := &fakePodResources{sock: filepath.Join(dir, "pod-resources.sock"), held: map[string][]string{}, resource: resource}
	f.start(t)
	t.Cleanup(f.stop)
	return f
}

func (f *fakePodResources) start(t *testing.T) {
	lis, err := net.Listen("unix", f.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, f)
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
}

func (f *fakePodResources) stop() {
	f.mu.Lock()
	srv := f.srv
	f.srv = nil
	f.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

func (f *fakePodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	resp := &podresourcesapi.ListPodResourcesResponse{}
	if f.amnesiac {
		return resp, nil
	}
	if ns, name, ok := strings.Cut(f.self, "/"); ok {
		resp.PodResources = append(resp.PodResources, &podresourcesapi.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesapi.ContainerResources{{Name: "shim"}}})
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range f.held {
			if !yield(k) {
				return
			}
		}
	}) {
		pod, ctr, _ := strings.Cut(k, "/")
		resp.PodResources = append(resp.PodResources, &podresourcesapi.PodResources{
			Namespace: "default", Name: pod,
			Containers: []*podresourcesapi.ContainerResources{{Name: ctr, Devices: devicesAsTheKubeletLists(f.resource, f.held[k])}},
		})
	}
	return resp, nil
}

// devicesAsTheKubeletLists lists each ID in an entry of its own, once
// per NUMA node (the kubelet's containerDevicesFromResourceDeviceInstances),
// beside another plugin's device.
func devicesAsTheKubeletLists(resource string, ids []string) []*podresourcesapi.ContainerDevices {
	out := []*podresourcesapi.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-0"}}}
	for _, id := range ids {
		for numa := range int64(2) {
			out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id},
				Topology: &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: numa}}}})
		}
	}
	return out
}

func (f *fakePodResources) hold(container string, ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ids == nil {
		delete(f.held, container)
		return
	}
	f.held[container] = ids
}

func (f *fakePodResources) listCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists
}

// waitListed waits until the shim has listed twice more, so that one
// whole settle pass saw the fake's state as it is now.
func (e *env) waitListed(f *fakePodResources) {
	e.t.Helper()
	n := f.listCount()
	eventually(e.t, "the shim to list pod resources", func() bool { return f.listCount() >= n+2 })
}

// testGrace is how long a hand-out the kubelet does not list counts.
const testGrace = 3 * time.Second

// MPS on GPUs 0-3 (four seats each), a long time slice on pairs of 4-7.
const shimSharingConfig = `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  gpus: [0, 1, 2, 3]
  sharing: {strategy: mps}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  gpus: [4, 5, 6, 7]
  sharing: {timeSlicing: {interval: Long}}
`

// shimMPS is a shim node with MPS, a simulated daemon and a fake
// PodResources API, not started yet.
type shimMPS struct {
	*env
	control, root string
	pr            *fakePodResources
}

func newShimMPS(t *testing.T) *shimMPS {
	t.Helper()
	return newShimMPSConfig(t, shimSharingConfig)
}

func newShimMPSConfig(t *testing.T, config string) *shimMPS {
	t.Helper()
	control := mpstest.Build(t)
	e := newEnv(t, "nvlink-2x4", config)
	root := filepath.Join(e.dir, "..", "mps")
	t.Cleanup(func() { _ = os.RemoveAll(root) }) // stops a daemon a failed test leaves
	mpstest.UnmountAtEnd(t, root)
	return &shimMPS{env: e, control: control, root: root, pr: newFakePodResources(t, filepath.Join(e.dir, ".."), "kyb.ai/gpu-1x-seat")}
}

func (s *shimMPS) start(mutate ...func(*Sharing)) { s.startSharing(s.root, s.control, s.pr, mutate...) }

func (e *env) startSharing(root, control string, pr *fakePodResources, mutate ...func(*Sharing)) {
	e.t.Helper()
	host := &gpuhost.Host{NVML: e.sim.NVML(), Simulated: e.sim}
	mgr, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: host.SetExclusive, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		e.t.Fatal(err)
	}
	client, err := podresources.NewClient(pr.sock)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = client.Close() })
	e.start(func(o *Options) {
		o.Sharing = Sharing{Hardware: &groupshare.Hardware{Inv: e.inv, MPS: mgr, SetTimeSlice: host.SetTimeSlice}, Assigned: client.List, Poll: 20 * time.Millisecond, Grace: testGrace}
		for _, m := range mutate {
			m(&o.Sharing)
		}
	})
}

// The shim keeps MPS seats to their shares as the DRA plugin does: the
// daemon runs while the kubelet lists a container holding a seat of its
// group, with the largest share one holds, and stops after the last.
func TestShimMPSSeatsHoldTheirSharesOverRealSockets(t *testing.T) {
	s := newShimMPS(t)
	e, control, root, pr := s.env, s.control, s.root, s.pr
	s.start()
	dir := filepath.Join(root, "g0-1x")
	pipe := filepath.Join(dir, mps.PipeDir)

	resp, err := allocate(e, "kyb.ai/gpu-1x-seat", []string{"g0-1x-seat-0"})
	if err != nil {
		t.Fatal(err)
	}
	one := resp.ContainerResponses[0]
	for k, want := range map[string]string{
		"CUDA_MPS_PIPE_DIRECTORY":           "/tmp/nvidia-mps",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=20480M",
		"KYB_GPU_SEAT":                      "0",
	} {
		if one.Envs[k] != want {
			t.Errorf("%s=%q, want %q", k, one.Envs[k], want)
		}
	}
	mounts := map[string]string{}
	for _, m := range one.Mounts {
		mounts[m.ContainerPath] = m.HostPath
		// Clients write shared memory to /dev/shm; they only connect to
		// the sockets of the pipe directory, which a container's root
		// must not be able to replace.
		if want := m.ContainerPath == "/tmp/nvidia-mps"; m.ReadOnly != want {
			t.Errorf("mount %s: read-only %v, want %v", m.ContainerPath, m.ReadOnly, want)
		}
	}
	if mounts["/tmp/nvidia-mps"] != pipe || mounts["/dev/shm"] != filepath.Join(dir, mps.ShmDir) {
		t.Errorf("mounts %v, want the daemon's pipe and shm directories", mounts)
	}
	if m := e.sim.ComputeMode(0); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 0 is %s while its daemon runs", simnode.ComputeModeName(m))
	}
	if got := mpstest.Join(t, control, pipe, "100", "0=80G"); got != "thread=25 mem=0=20480M" {
		t.Errorf("a container that raised its environment got %q, want the seat's share", got)
	}
	pr.hold("one/main", "g0-1x-seat-0")

	// Two seats in one container: half, and the daemon allows half while
	// they are held.
	resp, err = allocate(e, "kyb.ai/gpu-1x-seat", []string{"g0-1x-seat-1", "g0-1x-seat-2"})
	if err != nil {
		t.Fatal(err)
	}
	two := resp.ContainerResponses[0].Envs
	if two["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "50" || two["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=40960M" {
		t.Errorf("two seats' container: %s, %s", two["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], two["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
	if got := mpstest.Join(t, control, pipe, "50", "0=40960M"); got != "thread=50 mem=0=40960M" {
		t.Errorf("the two seats' container got %q", got)
	}
	// The settle loop runs meanwhile: a hand-out the kubelet does not list
	// yet keeps its share.
	e.waitListed(pr)
	if got := mpstest.Join(t, control, pipe, "50", "0=40960M"); got != "thread=50 mem=0=40960M" {
		t.Errorf("before the kubelet lists it, the two seats' container got %q", got)
	}
	pr.hold("two/main", "g0-1x-seat-1", "g0-1x-seat-2")
	// Past the grace period, the kubelet's list alone keeps its share.
	time.Sleep(testGrace)
	e.waitListed(pr)
	if got := mpstest.Join(t, control, pipe, "50", "0=40960M"); got != "thread=50 mem=0=40960M" {
		t.Errorf("while the kubelet lists it, the two seats' container got %q", got)
	}

	// Its pod goes: the daemon comes back to one seat's share.
	pr.hold("two/main")
	eventually(t, "the daemon's limits to drop to one seat's", func() bool {
		return mpstest.LastCommand(t, filepath.Join(dir, mps.LogDir), "set_default_active_thread_percentage") == "set_default_active_thread_percentage 25"
	})
	// The last one goes: the daemon stops, the GPU is back in DEFAULT.
	pr.hold("one/main")
	eventually(t, "the daemon to stop after the group's last seat", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
	if m := e.sim.ComputeMode(0); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 0 is %s after its daemon stopped", simnode.ComputeModeName(m))
	}

	// A time-sliced pair: its interval on exactly its two GPUs.
	if _, err := allocate(e, "kyb.ai/gpu-2x-seat", []string{"g45-2x-seat-0"}); err != nil {
		t.Fatal(err)
	}
	var slicesSet []string
	for _, c := range e.sim.SharingChanges() {
		if c.What == "timeSlice" {
			slicesSet = append(slicesSet, fmt.Sprintf("GPU %d %s %s", c.GPU, c.What, c.Value))
		}
	}
	if want := []string{"GPU 4 timeSlice 3", "GPU 5 timeSlice 3"}; !slices.Equal(slicesSet, want) {
		t.Errorf("time slices set %q, want %q", slicesSet, want)
	}
}

// An mps profile that keeps the compute mode holds its seats to their
// shares through the shim too, and the plugin sets no GPU's compute mode.
func TestShimMPSSeatsThatKeepTheComputeModeOverRealSockets(t *testing.T) {
	s := newShimMPSConfig(t, strings.Replace(shimSharingConfig, "sharing: {strategy: mps}", "sharing: {strategy: mps, mps: {computeMode: keep}}", 1))
	e, control, root, pr := s.env, s.control, s.root, s.pr
	s.start()
	dir := filepath.Join(root, "g0-1x")

	resp, err := allocate(e, "kyb.ai/gpu-1x-seat", []string{"g0-1x-seat-0"})
	if err != nil {
		t.Fatal(err)
	}
	if env := resp.ContainerResponses[0].Envs; env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=20480M" {
		t.Errorf("the seat's container: %s, %s", env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
	if got := mpstest.Join(t, control, filepath.Join(dir, mps.PipeDir), "100", "0=80G"); got != "thread=25 mem=0=20480M" {
		t.Errorf("a container that raised its environment got %q, want the seat's share", got)
	}
	pr.hold("one/main", "g0-1x-seat-0")
	e.waitListed(pr)
	pr.hold("one/main")
	eventually(t, "the daemon to stop after the group's last seat", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
	if changes := e.sim.SharingChanges(); len(changes) > 0 {
		t.Errorf("the shim changed the GPUs' settings: %+v", changes)
	}
}

// What the shim cannot do right fails the one container, with the reason.
func TestShimMPSRefusalsOverRealSockets(t *testing.T) {
	s := newShimMPS(t)
	e, root, pr := s.env, s.root, s.pr
	s.start()

	_, err := allocate(e, "kyb.ai/gpu-1x-seat", []string{"g0-1x-seat-0", "g1-1x-seat-0"})
	if err == nil || !strings.Contains(err.Error(), "the container's seats are on 2 groups, and a container reaches one MPS daemon only") {
		t.Errorf("seats of two MPS groups in one container: %v", err)
	}
	// Without the kubelet's list, the daemon's limits cannot be known: the
	// container is refused rather than given a share others may exceed.
	pr.stop()
	_, err = allocate(e, "kyb.ai/gpu-1x-seat", []string{"g2-1x-seat-0"})
	if err == nil || !strings.Contains(err.Error(), "group G2: cannot learn which of its seats are held") {
		t.Errorf("MPS seat with the PodResources API gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "g2-1x")); !os.IsNotExist(err) {
		t.Errorf("a refused container's group has a daemon: %v", err)
	}
}

// A shim started again adopts the daemon of a group the kubelet lists and
// stops one of a group nobody holds, such as one an earlier configuration
// defined.
func TestShimRestartSettlesDaemonsOverRealSockets(t *testing.T) {
	s := newShimMPS(t)
	e, control, root, pr := s.env, s.control, s.root, s.pr
	mgr, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: func(context.Context, string, bool) error { return nil }, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"g0-1x", "g01-old"} {
		if err := mgr.Ensure(e.ctx, mps.Group{Name: g}, mps.Fixed(mps.Share(1, 4, []int64{81920}))); err != nil {
			t.Fatal(err)
		}
	}
	pr.hold("one/main", "g0-1x-seat-3")
	s.start()
	eventually(t, "the earlier configuration's daemon to stop", func() bool {
		_, err := os.Stat(filepath.Join(root, "g01-old"))
		return os.IsNotExist(err)
	})
	log, err := os.ReadFile(filepath.Join(root, "g0-1x", mps.LogDir, "control.log"))
	if err != nil {
		t.Fatalf("the held group's daemon: %v", err)
	}
	if n := strings.Count(string(log), "Control daemon started"); n != 1 {
		t.Errorf("g0-1x's daemon started %d times, want once: adopted", n)
	}
}

// A kubelet that has just started lists no pod until it has heard from
// the API server. The shim believes a listing only once it shows the
// shim's own pod, so the daemons of running pods are not stopped then.
func TestShimBelievesOnlyAKubeletThatListsItsOwnPodOverRealSockets(t *testing.T) {
	s := newShimMPS(t)
	e, root, pr := s.env, s.root, s.pr
	pr.self = "kube-system/kyb-shim-x"
	s.start(func(sh *Sharing) { sh.Self = pr.self })
	dir := filepath.Join(root, "g1-1x")
	if _, err := allocate(e, "kyb.ai/gpu-1x-seat", []string{"g1-1x-seat-0"}); err != nil {
		t.Fatal(err)
	}
	pr.hold("one/main", "g1-1x-seat-0")
	e.waitListed(pr)

	pr.mu.Lock()
	pr.amnesiac = true
	pr.mu.Unlock()
	time.Sleep(testGrace)
	e.waitListed(pr)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the daemon of a running pod's group went while the kubelet listed no pod: %v", err)
	}
	// A new container is still served, on the last believed listing.
	resp, err := allocate(e, "kyb.ai/gpu-1x-seat", []string{"g1-1x-seat-1"})
	if err != nil {
		t.Fatalf("Allocate while the kubelet lists no pod, after a believed listing: %v", err)
	}
	if got := resp.ContainerResponses[0].Envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]; got != "25" {
		t.Errorf("its share %q, want 25", got)
	}

	pr.mu.Lock()
	pr.amnesiac = false
	pr.mu.Unlock()
	pr.hold("one/main")
	eventually(t, "the daemon to stop once the kubelet knows its pods again", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
}
