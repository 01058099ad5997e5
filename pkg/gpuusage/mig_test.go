package gpuusage_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// makeInstance makes a MIG instance of profile at start on dev, MIG mode
// on, with the compute instance that takes it whole, and returns its GPU
// instance ID.
func makeInstance(t *testing.T, dev nvml.Device, profile string, start int) uint32 {
	t.Helper()
	if current, _, _ := dev.GetMigMode(); current != nvml.DEVICE_MIG_ENABLE {
		if activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); activation != nvml.SUCCESS || ret != nvml.SUCCESS {
			t.Fatalf("enable MIG: %v, %v", activation, ret)
		}
	}
	p, err := simnodetest.MIGModel(t, dev).Profile(profile)
	if err != nil {
		t.Fatal(err)
	}
	info, ret := dev.GetGpuInstanceProfileInfo(p.Index)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.MemorySlices)})
	if ret != nvml.SUCCESS {
		t.Fatalf("make %s at %d: %v", profile, start, ret)
	}
	whole := map[int]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
		4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[p.ComputeSlices]
	ci, ret := gi.GetComputeInstanceProfileInfo(whole, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ci); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gii, _ := gi.GetInfo()
	return gii.Id
}

// On a GPU in MIG mode every MIG device is sampled, with its memory, and
// each process is read from the MIG device it runs in, which it names.
func TestSamplerReadsMIGDevicesAndTheirProcesses(t *testing.T) {
	node, err := simnode.Load("dgx-h100", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	lib := node.NVML()
	dev, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	small := makeInstance(t, dev, "1g.10gb", 6)
	big := makeInstance(t, dev, "3g.40gb", 0)
	file := filepath.Join(t.TempDir(), "processes")
	node.SetProcessesFile(file)
	const cg = "0::/kubepods/besteffort/pod1a2b3c4d-5e6f-4711-8899-aabbccddeeff/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(file, simnode.FormatProcesses([]simnode.Process{
		{GPU: 0, GPUInstance: &small, PID: 10, MemoryMiB: 1000, SMPercent: 40, Cgroup: cg},
		{GPU: 0, GPUInstance: &big, PID: 11, MemoryMiB: 3000, Cgroup: cg},
		{GPU: 0, GPUInstance: &big, PID: 12, MemoryMiB: 24, Cgroup: "0::/system.slice/nvidia-mps.service"},
		{GPU: 1, PID: 13, MemoryMiB: 5, SMPercent: 30, Cgroup: cg},
	}), 0o644); err != nil {
		t.Fatal(err)
	}
	gpus := []gpuusage.GPU{{Index: 0, UUID: simnode.DeriveUUID("node-1", 0)}, {Index: 1, UUID: simnode.DeriveUUID("node-1", 1)}}
	s := gpuusage.NewSampler(lib, gpus, node.Cgroups(gpuusage.ProcCgroups{Root: "/proc"}))
	u := s.Sample()
	if len(u) != 2 || u[0].Err != nil || u[1].Err != nil {
		t.Fatalf("sample: %+v", u)
	}
	var instances []string
	for _, in := range u[0].Instances {
		if !strings.HasPrefix(in.UUID, "MIG-") {
			t.Errorf("instance %d has UUID %q", in.GPUInstance, in.UUID)
		}
		instances = append(instances, fmt.Sprintf("gi%d@%s used %dMiB of %dMiB", in.GPUInstance, in.Placement, in.MemoryUsedBytes>>20, in.MemoryTotalBytes>>20))
	}
	want := fmt.Sprintf("gi%d@{0}:4 used 3024MiB of 40448MiB gi%d@{6}:1 used 1000MiB of 9984MiB", big, small)
	if got := strings.Join(instances, " "); got != want {
		t.Errorf("GPU 0's MIG devices:\n got %s\nwant %s", got, want)
	}
	var procs []string
	for _, p := range u[0].Processes {
		where := "-"
		if p.Instance != nil {
			where = fmt.Sprintf("gi%d", p.Instance.GPUInstance)
		}
		procs = append(procs, fmt.Sprintf("%d@%s:%dMiB:pod=%v", p.PID, where, p.MemoryBytes>>20, p.InPod))
	}
	want = fmt.Sprintf("11@gi%d:3000MiB:pod=true 12@gi%d:24MiB:pod=false 10@gi%d:1000MiB:pod=true", big, big, small)
	if got := strings.Join(procs, " "); got != want {
		t.Errorf("GPU 0's processes:\n got %s\nwant %s", got, want)
	}
	if len(u[1].Instances) != 0 || len(u[1].Processes) != 1 || u[1].Processes[0].Instance != nil || u[1].Processes[0].SMPercent != 30 {
		t.Errorf("GPU 1, not in MIG mode: %+v", u[1])
	}

	// A MIG device destroyed between the list and its calls (a claim
	// unprepared meanwhile) is left out; the GPU's other ones are read.
	if err := node.FailCall(simnode.CallFault{Call: simnode.CallMigDeviceGetUUID, Nth: 1, Ret: nvml.ERROR_INVALID_ARGUMENT}); err != nil {
		t.Fatal(err)
	}
	if u = s.Sample(); u[0].Err != nil || len(u[0].Instances) != 1 || len(u[0].Processes) != 1 {
		t.Errorf("with a MIG device gone: %v, %d MIG devices, %d processes; want no error, 1, 1", u[0].Err, len(u[0].Instances), len(u[0].Processes))
	}
	// Any other failure is the GPU's.
	if err := node.FailCall(simnode.CallFault{Call: simnode.CallMigDeviceGetUUID, Nth: 1, Ret: nvml.ERROR_UNKNOWN}); err != nil {
		t.Fatal(err)
	}
	if u = s.Sample(); u[0].Err == nil || !strings.Contains(u[0].Err.Error(), "GPU 0 MIG device 0: UUID: ") {
		t.Errorf("with a MIG device failing: %v, want the GPU's error", u[0].Err)
	}
}
