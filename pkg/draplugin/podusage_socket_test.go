package draplugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cri"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cri/critest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// usageNode is what the per-pod GPU metrics read on a node besides NVML:
// the container runtime (CRI), the kubelet's PodResources API and the
// host's procfs (processes' mounts), each a real socket or directory.
type usageNode struct {
	runtime *critest.Server
	kubelet *podresourcestest.Server
	proc    string
}

// withUsage samples the simulated GPUs' processes, described by file,
// every 20 ms, and names their containers through u.
func withUsage(e *env, file string, u *usageNode) envOption {
	dir := sockettest.Dir(e.t)
	u.runtime = critest.Start(e.t, filepath.Join(dir, "containerd.sock"))
	u.kubelet = podresourcestest.Start(e.t, filepath.Join(dir, "kubelet.sock"))
	u.proc = filepath.Join(dir, "proc")
	runtime, err := cri.NewClient(u.runtime.Socket)
	if err != nil {
		e.t.Fatal(err)
	}
	kubelet, err := podresources.NewClient(u.kubelet.Socket)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = runtime.Close(); _ = kubelet.Close() })
	return withOptions(func(o *draplugin.Options) {
		e.sim.SetProcessesFile(file)
		var gpus []gpuusage.GPU
		for _, g := range e.inv.GPUs {
			gpus = append(gpus, gpuusage.GPU{Index: g.Index, UUID: g.UUID})
		}
		o.Usage = podusage.Options{Interval: 20 * time.Millisecond,
			Sampler:    gpuusage.NewSampler(e.sim.NVML(), gpus, e.sim.Cgroups(gpuusage.ProcCgroups{Root: "/proc"})),
			Containers: runtime, Mounts: gpuusage.ProcMounts{Root: u.proc}}
		o.PodResources = kubelet
	})
}

// run makes a container of a pod run: the runtime knows it, and the
// kubelet lists it with claims.
func (u *usageNode) run(t *testing.T, podUID, namespace, pod, container, id string, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	u.runtime.Add(cri.Container{ID: id, PodUID: podUID, PodNamespace: namespace, PodName: pod, Name: container})
	u.kubelet.SetPod(namespace, pod, ctr(container, claims...), ctr("sidecar"))
}

// mount gives process pid the mounts a runtime makes from a container's
// OCI spec, as its /proc/PID/mountinfo shows them, and extra lines as they
// are. Every running process has the file.
func (u *usageNode) mount(t *testing.T, pid uint32, mounts []oci.Mount, extra ...string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("1203 1150 0:312 / / rw,relatime - overlay overlay rw\n")
	for i, m := range mounts {
		// A bind mount from the host's filesystem the source is on,
		// taken to be mounted at /: its root is the source path.
		fmt.Fprintf(&b, "%d 1203 %s %s %s ro,relatime - ext4 /dev/nvme0n1p2 rw\n", 1300+i, mountDevice(m.Source), m.Source, m.Destination)
	}
	for _, l := range extra {
		b.WriteString(l + "\n")
	}
	dir := filepath.Join(u.proc, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "mountinfo"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mountDevice is the major:minor mountinfo shows for the filesystem path
// is on (259:2, a disk's partition, where path is not on this machine).
func mountDevice(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "259:2"
	}
	return fmt.Sprintf("%d:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)))
}

// Each container's GPU memory and SM share is its seat's: processes are
// read from the simulated NVML, their containers from their cgroups, the
// containers from the runtime, their claims from the kubelet (whole: no
// container here has device metadata), the seats from the ledger.
// What no seat explains is reported apart, with why.
func TestPerPodGPUUsageOverSockets(t *testing.T) {
	var e *env
	var u usageNode
	file := filepath.Join(t.TempDir(), "processes")
	e = newEnv(t, "nvlink-2x4", seed, func(x *env) { e = x; withUsage(x, file, &u)(x) })
	a, b := e.claim(class1x), e.claim(class1x)
	envA, _ := e.container(e.prepareOK(a)...)
	envB, _ := e.container(e.prepareOK(b)...)
	if envA["KYB_GPU_GROUP"] != envB["KYB_GPU_GROUP"] {
		t.Fatalf("the two seats are on groups %s and %s; the test wants one GPU", envA["KYB_GPU_GROUP"], envB["KYB_GPU_GROUP"])
	}
	group := envA["KYB_GPU_GROUP"]
	gpu := -1
	for _, g := range e.inv.GPUs {
		if g.UUID == envA["CUDA_VISIBLE_DEVICES"] {
			gpu = g.Index
		}
	}
	other := (gpu + 1) % len(e.inv.GPUs)

	const uidA, uidB = "aaaaaaaa-0000-4000-8000-00000000000a", "bbbbbbbb-0000-4000-8000-00000000000b"
	idA, idB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	u.run(t, uidA, a.Namespace, "trainer", "train", idA, a)
	u.run(t, uidB, b.Namespace, "server-7f9c", "serve", idB, b)
	cgA := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uidA, "-", "_") + ".slice/cri-containerd-" + idA + ".scope"
	cgB := "0::/kubepods/besteffort/pod" + uidB + "/" + idB
	procs := []simnode.Process{
		{GPU: gpu, PID: 101, MemoryMiB: 2048, SMPercent: 30, Cgroup: cgA},
		{GPU: gpu, PID: 102, MemoryMiB: 1024, SMPercent: 20, Cgroup: cgA},
		{GPU: gpu, PID: 201, MemoryMiB: 4096, SMPercent: 25, Cgroup: cgB},
		{GPU: gpu, PID: 300, MemoryMiB: 512, SMPercent: 0, Cgroup: "0::/system.slice/nvidia-mps.service"},
		{GPU: other, PID: 103, MemoryMiB: 100, SMPercent: 5, Cgroup: cgA},
	}
	for _, pid := range []uint32{101, 102, 201, 103} {
		u.mount(t, pid, nil)
	}
	if err := os.WriteFile(file, simnode.FormatProcesses(procs), 0o644); err != nil {
		t.Fatal(err)
	}

	ns := a.Namespace
	seatOf := func(env map[string]string) string { return env["KYB_GPU_SEAT"] }
	series := func(pod, container, seat string) map[string]string {
		return map[string]string{"namespace": ns, "pod": pod, "container": container, "group": group, "seat": seat, "gpu": strconv.Itoa(gpu)}
	}
	waitFor := func(what, name string, labels map[string]string, want float64) {
		t.Helper()
		var got float64
		var ok bool
		err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			got, ok = e.gathered(name, labels)
			return ok && got == want, nil
		})
		if err != nil {
			t.Fatalf("%s: %s%v = %v (present %v), want %v", what, name, labels, got, ok, want)
		}
	}
	const mib = 1 << 20
	waitFor("trainer's two processes", "kyb_container_gpu_memory_used_bytes", series("trainer", "train", seatOf(envA)), 3072*mib)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kyb_container_gpu_sm_utilization_ratio", series("trainer", "train", seatOf(envA)), 0.5},
		{"kyb_container_gpu_processes", series("trainer", "train", seatOf(envA)), 2},
		{"kyb_container_gpu_memory_used_bytes", series("server-7f9c", "serve", seatOf(envB)), 4096 * mib},
		{"kyb_container_gpu_sm_utilization_ratio", series("server-7f9c", "serve", seatOf(envB)), 0.25},
		{"kyb_gpu_unattributed_memory_used_bytes", map[string]string{"gpu": strconv.Itoa(gpu), "reason": "outside-pods"}, 512 * mib},
		{"kyb_gpu_unattributed_memory_used_bytes", map[string]string{"gpu": strconv.Itoa(gpu), "reason": "no-seat-here"}, 0},
		{"kyb_gpu_unattributed_memory_used_bytes", map[string]string{"gpu": strconv.Itoa(other), "reason": "no-seat-here"}, 100 * mib},
		{"kyb_gpu_memory_used_bytes", map[string]string{"gpu": strconv.Itoa(gpu)}, (2048 + 1024 + 4096 + 512) * mib},
		{"kyb_gpu_sm_utilization_ratio", map[string]string{"gpu": strconv.Itoa(gpu)}, 0.75},
	} {
		if got, ok := e.gathered(c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := e.gathered("kyb_container_gpu_memory_used_bytes", map[string]string{"gpu": strconv.Itoa(other)}); ok {
		t.Errorf("trainer's process on GPU %d, which it holds no seat of, is given to a seat", other)
	}

	// A container is looked up when it is new, not at every sample.
	before, gets := u.runtime.Lists(), u.kubelet.Gets()
	time.Sleep(200 * time.Millisecond)
	if after := u.runtime.Lists(); after != before || before == 0 || u.kubelet.Gets() != gets {
		t.Errorf("containers looked up %d times, then %d more over 10 samples with no new container (PodResources: %d more); want at least one, then none", before, after-before, u.kubelet.Gets()-gets)
	}

	// A process that outlives its seat's release is no seat's any more.
	e.unprepare(b)
	waitFor("server's process after its claim is released", "kyb_gpu_unattributed_memory_used_bytes",
		map[string]string{"gpu": strconv.Itoa(gpu), "reason": "no-seat-here"}, 4096*mib)
	if _, ok := e.gathered("kyb_container_gpu_memory_used_bytes", map[string]string{"pod": "server-7f9c"}); ok {
		t.Error("the released seat still reports the server's memory")
	}
}

// Every metric the chart's Grafana dashboard queries is one the plugin
// serves, with the labels the queries select on, but kyb-scheduler's
// (kyb_placement_*). The node has a sized profile beside equal seats, as
// the dashboard's sized panels need.
func TestTheDashboardQueriesWhatThePluginServes(t *testing.T) {
	var e *env
	file := filepath.Join(t.TempDir(), "processes")
	e = newEnv(t, "nvlink-2x4", `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
- {resource: kyb.ai/gpu-1x-sized, seatsPerGroup: 4, gpus: [7], sharing: {strategy: mps, sized: true}}
`, func(x *env) { e = x; withUsage(x, file, &usageNode{})(x) })
	raw, err := os.ReadFile("../../deployments/helm/kyb-dra-driver/dashboards/kyb-gpu-seats.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	// Series exist once a sample has run.
	if err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, ok := e.gathered("kyb_gpu_memory_used_bytes", nil)
		return ok, nil
	}); err != nil {
		t.Fatal("no GPU usage sampled")
	}
	families, err := e.driver.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	// The labels of each family; node comes from the scrape (the chart's
	// relabeling), le from a histogram's buckets.
	labels := map[string]map[string]bool{}
	for _, f := range families {
		set := map[string]bool{"node": true, "le": true}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				set[l.GetName()] = true
			}
		}
		labels[f.GetName()] = set
	}
	// Families that have no series until a container holds a seat.
	for _, name := range []string{"kyb_container_gpu_memory_used_bytes", "kyb_container_gpu_sm_utilization_ratio", "kyb_container_gpu_memory_size_bytes", "kyb_container_gpu_compute_size_ratio"} {
		labels[name] = map[string]bool{"node": true, "namespace": true, "pod": true, "container": true, "group": true, "seat": true, "gpu": true}
	}
	metric := regexp.MustCompile(`\b(kyb_[a-z_]+)(\{([^}]*)\})?`)
	label := regexp.MustCompile(`([a-z_]+)\s*(=~|!=|=)`)
	queries := 0
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			for _, m := range metric.FindAllStringSubmatch(q.Expr, -1) {
				queries++
				if strings.HasPrefix(m[1], "kyb_placement_") {
					// kyb-scheduler's, which its own test checks
					// (cmd/kyb-scheduler/placement).
					continue
				}
				name := strings.TrimSuffix(m[1], "_bucket")
				set, ok := labels[name]
				if !ok {
					t.Errorf("panel %q queries %s, which the plugin does not serve", p.Title, m[1])
					continue
				}
				for _, l := range label.FindAllStringSubmatch(m[3], -1) {
					if !set[l[1]] {
						t.Errorf("panel %q selects %s on label %s, which it does not have", p.Title, name, l[1])
					}
				}
			}
		}
	}
	if queries < len(dash.Panels) {
		t.Errorf("%d metrics queried over %d panels", queries, len(dash.Panels))
	}
}
