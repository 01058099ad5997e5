package simnode

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestMIGGPUInstanceWithComputeInstanceRefusesDestroy(t *testing.T) {
	n, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	gi, ret := createGI(t, d, m, "3g.40gb", 0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ci, ret := fullCI(t, gi)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Fatalf("destroy a GPU instance with a compute instance: %v, want ERROR_IN_USE", ret)
	}
	if got, want := layout(n, 0), "mode 1/1; GI 1 3g.40gb@{0}:4 CI 0 3c@0"; got != want {
		t.Fatalf("after the refused destroy: %s, want %s", got, want)
	}
	// MIG cannot be turned off under a GPU instance either.
	if activation, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); activation != nvml.ERROR_IN_USE || ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode(disable) with a GPU instance: %v, %v; want ERROR_IN_USE, SUCCESS", activation, ret)
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatalf("destroy the compute instance: %v", ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatalf("destroy the empty GPU instance: %v", ret)
	}
	// Handles of destroyed instances are no longer valid.
	if _, ret := gi.GetInfo(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetInfo of a destroyed GPU instance: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if ret := ci.Destroy(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("destroy a destroyed compute instance: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if _, ret := d.GetGpuInstanceById(1); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetGpuInstanceById(1) after destroy: %v, want ERROR_NOT_FOUND", ret)
	}
	if activation, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); activation != nvml.SUCCESS || ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode(disable) on an empty GPU: %v, %v", activation, ret)
	}
	if got, want := layout(n, 0), "mode 0/0"; got != want {
		t.Errorf("at the end: %s, want %s", got, want)
	}
}

func TestMIGComputeInstanceProfiles(t *testing.T) {
	_, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	seven, _ := createGI(t, d, m, "7g.80gb", 0)
	var got []string
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := seven.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS {
			got = append(got, fmt.Sprintf("%d:%dc/%d/%dSM", info.Id, info.SliceCount, info.InstanceCount, info.MultiprocessorCount))
		}
	}
	if want := "0:1c/7/16SM 1:2c/3/32SM 2:3c/2/60SM 3:4c/1/64SM 4:7c/1/132SM"; strings.Join(got, " ") != want {
		t.Errorf("7g.80gb compute instance profiles: %s, want %s", strings.Join(got, " "), want)
	}
	if _, ret := seven.GetComputeInstanceProfileInfo(0, 1); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("engine profile 1: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if ret := seven.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}

	four, _ := createGI(t, d, m, "4g.40gb", 0)
	if _, ret := four.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("a 3-slice compute instance in a 4g: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	three, _ := createGI(t, d, m, "3g.40gb", 4)
	one, _ := three.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
	two, _ := three.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 0)
	for _, step := range []struct {
		info *nvml.ComputeInstanceProfileInfo
		want nvml.Return
	}{
		{&two, nvml.SUCCESS},
		{&one, nvml.SUCCESS},
		{&one, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{&two, nvml.ERROR_INSUFFICIENT_RESOURCES},
	} {
		if _, ret := three.CreateComputeInstance(step.info); ret != step.want {
			t.Errorf("a %d-slice compute instance in the 3g: %v, want %v", step.info.SliceCount, ret, step.want)
		}
	}
	cis, ret := three.GetComputeInstances(&one)
	if ret != nvml.SUCCESS || len(cis) != 1 {
		t.Fatalf("1-slice compute instances: %d, %v; want 1", len(cis), ret)
	}
	if got, ret := three.GetComputeInstanceById(1); ret != nvml.SUCCESS || got != cis[0] {
		t.Errorf("GetComputeInstanceById(1): %v, %v; want the 1-slice instance", got, ret)
	}
	if _, ret := three.GetComputeInstanceById(5); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetComputeInstanceById(5): %v, want ERROR_NOT_FOUND", ret)
	}
}

func TestMIGDevices(t *testing.T) {
	n, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	parentUUID, _ := d.GetUUID()
	for _, p := range []struct {
		name  string
		start int
	}{{"3g.40gb", 4}, {"1g.10gb", 0}, {"2g.20gb", 2}} {
		gi, ret := createGI(t, d, m, p.name, p.start)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		if _, ret := fullCI(t, gi); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	if max, ret := d.GetMaxMigDeviceCount(); max != 7 || ret != nvml.SUCCESS {
		t.Errorf("GetMaxMigDeviceCount: %d, %v; want 7", max, ret)
	}
	if is, ret := d.IsMigDeviceHandle(); is || ret != nvml.SUCCESS {
		t.Errorf("IsMigDeviceHandle of the GPU: %v, %v; want false", is, ret)
	}
	var got []string
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		md, ret := d.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			t.Fatalf("GetMigDeviceHandleByIndex(%d): %v", i, ret)
		}
		uuid, _ := md.GetUUID()
		if !strings.HasPrefix(uuid, "MIG-") || len(uuid) != len("MIG-")+36 || seen[uuid] || strings.Contains(uuid, parentUUID[4:]) {
			t.Errorf("MIG device %d: UUID %q, want a MIG-<uuid> of its own", i, uuid)
		}
		seen[uuid] = true
		if is, ret := md.IsMigDeviceHandle(); !is || ret != nvml.SUCCESS {
			t.Errorf("IsMigDeviceHandle of MIG device %d: %v, %v", i, is, ret)
		}
		if parent, ret := md.GetDeviceHandleFromMigDeviceHandle(); parent != d || ret != nvml.SUCCESS {
			t.Errorf("parent of MIG device %d: %v, %v; want GPU 0", i, parent, ret)
		}
		if byUUID, ret := n.NVML().DeviceGetHandleByUUID(uuid); byUUID != md || ret != nvml.SUCCESS {
			t.Errorf("DeviceGetHandleByUUID(%s): %v, %v; want MIG device %d", uuid, byUUID, ret, i)
		}
		giID, _ := md.GetGpuInstanceId()
		ciID, _ := md.GetComputeInstanceId()
		name, _ := md.GetName()
		attrs, _ := md.GetAttributes()
		mem, _ := md.GetMemoryInfo()
		got = append(got, fmt.Sprintf("GI %d CI %d %s %dSM %dMiB", giID, ciID, name, attrs.MultiprocessorCount, mem.Total>>20))
	}
	want := []string{
		"GI 2 CI 0 NVIDIA H100 80GB HBM3 MIG 3g.40gb 60SM 40448MiB",
		"GI 4 CI 0 NVIDIA H100 80GB HBM3 MIG 2g.20gb 32SM 20096MiB",
		"GI 7 CI 0 NVIDIA H100 80GB HBM3 MIG 1g.10gb 16SM 9984MiB",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("MIG devices:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, ret := d.GetMigDeviceHandleByIndex(3); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetMigDeviceHandleByIndex(3): %v, want ERROR_NOT_FOUND", ret)
	}
	if _, ret := d.GetMigDeviceHandleByIndex(7); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetMigDeviceHandleByIndex(7): %v, want ERROR_INVALID_ARGUMENT", ret)
	}

	// Made again at the same IDs, a compute instance has a new UUID.
	md, _ := d.GetMigDeviceHandleByIndex(0)
	oldUUID, _ := md.GetUUID()
	gi, _ := d.GetGpuInstanceById(2)
	ci, _ := gi.GetComputeInstanceById(0)
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := md.GetUUID(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetUUID of a destroyed MIG device: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if _, ret := n.NVML().DeviceGetHandleByUUID(oldUUID); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByUUID of a destroyed MIG device: %v, want ERROR_NOT_FOUND", ret)
	}
	if _, ret := fullCI(t, gi); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	md, _ = d.GetMigDeviceHandleByIndex(0)
	if newUUID, _ := md.GetUUID(); newUUID == oldUUID {
		t.Errorf("the compute instance made again kept UUID %s", oldUUID)
	}
}

// TestMIGLostGPU: a GPU off the bus answers its MIG calls as its others.
func TestMIGLostGPU(t *testing.T) {
	n, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	gi, _ := createGI(t, d, m, "7g.80gb", 0)
	if err := n.SetLost(0, true); err != nil {
		t.Fatal(err)
	}
	if _, _, ret := d.GetMigMode(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("GetMigMode: %v, want ERROR_GPU_IS_LOST", ret)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("Destroy: %v, want ERROR_GPU_IS_LOST", ret)
	}
	if got, want := layout(n, 0), "mode 1/1; GI 0 7g.80gb@{0}:8"; got != want {
		t.Errorf("%s, want %s", got, want)
	}
}
