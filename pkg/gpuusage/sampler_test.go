package gpuusage_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// The sampler over a simulated node's NVML: memory and SM shares per
// process, each process's container from its cgroup, a GPU that stops
// answering.
func TestSamplerReadsProcessesAndTheirContainers(t *testing.T) {
	node, err := simnode.Load("workstation-2gpu", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	lib := node.NVML()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("init: %v", ret)
	}
	file := filepath.Join(t.TempDir(), "processes")
	node.SetProcessesFile(file)
	const cg = "0::/kubepods/besteffort/pod1a2b3c4d-5e6f-4711-8899-aabbccddeeff/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	write := func(procs ...simnode.Process) {
		t.Helper()
		if err := os.WriteFile(file, simnode.FormatProcesses(procs), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(
		simnode.Process{GPU: 0, PID: 10, MemoryMiB: 1000, SMPercent: 40, Cgroup: cg},
		simnode.Process{GPU: 0, PID: 11, MemoryMiB: 24, SMPercent: 10, Cgroup: "0::/system.slice/nvidia-mps.service"},
		simnode.Process{GPU: 1, PID: 4194305, MemoryMiB: 5, SMPercent: 0},
	)
	gpus := []gpuusage.GPU{{Index: 0, UUID: simnode.DeriveUUID("node-1", 0)}, {Index: 1, UUID: simnode.DeriveUUID("node-1", 1)}}
	// PID 4194305 is above any kernel's pid_max: its real cgroup cannot be read.
	s := gpuusage.NewSampler(lib, gpus, node.Cgroups(gpuusage.ProcCgroups{Root: "/proc"}))
	u := s.Sample()
	if len(u) != 2 || u[0].Err != nil || u[1].Err != nil {
		t.Fatalf("sample: %+v", u)
	}
	if u[0].MemoryUsedBytes != 1024<<20 || u[0].SMPercent != 50 || len(u[0].Processes) != 2 {
		t.Errorf("GPU 0: used %d, SM %d%%, %d processes; want %d, 50%%, 2", u[0].MemoryUsedBytes, u[0].SMPercent, len(u[0].Processes), 1024<<20)
	}
	p := u[0].Processes[0]
	want := gpuusage.Container{PodUID: "1a2b3c4d-5e6f-4711-8899-aabbccddeeff", ID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	if p.PID != 10 || p.MemoryBytes != 1000<<20 || p.SMPercent != 40 || !p.InPod || p.Container != want {
		t.Errorf("process 10: %+v", p)
	}
	if q := u[0].Processes[1]; q.InPod || q.CgroupErr != nil {
		t.Errorf("the MPS daemon: %+v, want outside any pod", q)
	}
	if q := u[1].Processes[0]; q.InPod || q.CgroupErr == nil {
		t.Errorf("a process whose cgroup cannot be read: %+v", q)
	}

	// The next sample averages only what is newer; a process gone is gone.
	time.Sleep(2 * time.Millisecond)
	write(simnode.Process{GPU: 0, PID: 10, MemoryMiB: 2000, SMPercent: 90, Cgroup: cg})
	u = s.Sample()
	if got := u[0].Processes; len(got) != 1 || got[0].SMPercent != 90 || got[0].MemoryBytes != 2000<<20 {
		t.Errorf("second sample of GPU 0: %+v", got)
	}
	if len(u[1].Processes) != 0 || u[1].MemoryUsedBytes != 0 {
		t.Errorf("GPU 1 after its process ended: %+v", u[1])
	}

	if err := node.SetLost(1, true); err != nil {
		t.Fatal(err)
	}
	if u = s.Sample(); u[0].Err != nil || u[1].Err == nil {
		t.Errorf("with GPU 1 lost: errors %v, %v; want none, one", u[0].Err, u[1].Err)
	}
}
