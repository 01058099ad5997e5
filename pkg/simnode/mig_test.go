package simnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// gpu0 loads a preset and returns its first GPU and that GPU's MIG
// geometry, read through NVML from another node of the preset, so that
// the node returned has answered no call yet.
func gpu0(t *testing.T, preset string) (*Node, nvml.Device, mig.Model) {
	t.Helper()
	device := func() (*Node, nvml.Device) {
		n, err := Load(preset, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		d, ret := n.NVML().DeviceGetHandleByIndex(0)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		return n, d
	}
	_, other := device()
	n, d := device()
	return n, d, mustModel(t, other)
}

func enableMIG(t *testing.T, d nvml.Device) {
	t.Helper()
	if activation, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); activation != nvml.SUCCESS || ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode(enable) = %v, %v; want SUCCESS, SUCCESS", activation, ret)
	}
}

// profileInfo asks NVML for a profile by its NVML index, as a driver does.
func profileInfo(t *testing.T, d nvml.Device, m mig.Model, name string) nvml.GpuInstanceProfileInfo {
	t.Helper()
	p, err := m.Profile(name)
	if err != nil {
		t.Fatal(err)
	}
	info, ret := d.GetGpuInstanceProfileInfo(p.Index)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetGpuInstanceProfileInfo(%d) for %s: %v", p.Index, name, ret)
	}
	return info
}

func createGI(t *testing.T, d nvml.Device, m mig.Model, name string, start int) (nvml.GpuInstance, nvml.Return) {
	t.Helper()
	info := profileInfo(t, d, m, name)
	// A placement's size counts memory slices, the profile's SliceCount
	// compute slices: 1g.20gb sits on two memory slices.
	p, _ := m.Profile(name)
	return d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.MemorySlices)})
}

// fullCI makes the compute instance that takes the whole GPU instance.
func fullCI(t *testing.T, gi nvml.GpuInstance) (nvml.ComputeInstance, nvml.Return) {
	t.Helper()
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		t.Fatalf("GpuInstance.GetInfo: %v", ret)
	}
	slices := map[uint32]int{19: 1, 20: 1, 15: 1, 14: 2, 9: 3, 5: 4, 0: 7}[giInfo.ProfileId]
	profile := map[int]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[slices]
	info, ret := gi.GetComputeInstanceProfileInfo(profile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeInstanceProfileInfo(%d): %v", profile, ret)
	}
	return gi.CreateComputeInstance(&info)
}

// layout writes GPU i's MIG state as the simulation holds it.
func layout(n *Node, i int) string {
	n.migNode.mu.Lock()
	defer n.migNode.mu.Unlock()
	g := n.gpus[i]
	s := fmt.Sprintf("mode %d/%d", g.current, g.pending)
	for _, gi := range sortedByID(g.gis) {
		s += fmt.Sprintf("; GI %d %s@%s", gi.id, gi.profile.Name, gi.placement)
		for _, ci := range sortedByID(gi.cis) {
			s += fmt.Sprintf(" CI %d %dc@%d", ci.id, ci.profile.slices, ci.start)
		}
	}
	return s
}

func TestMIGModeChange(t *testing.T) {
	for _, tt := range []struct {
		name, preset string
		busy         bool
		// wantActivation is SetMigMode(enable)'s activation status, and
		// current/pending the modes after it.
		wantActivation   nvml.Return
		current, pending int
	}{
		{name: "Hopper switches at once", preset: "dgx-h100", wantActivation: nvml.SUCCESS, current: 1, pending: 1},
		{name: "Ampere waits for a reset", preset: "dgx-a100", wantActivation: nvml.ERROR_RESET_REQUIRED, current: 0, pending: 1},
		{name: "Hopper in use", preset: "dgx-h100", busy: true, wantActivation: nvml.ERROR_IN_USE, current: 0, pending: 1},
		{name: "Ampere in use", preset: "dgx-a100", busy: true, wantActivation: nvml.ERROR_IN_USE, current: 0, pending: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n, d, _ := gpu0(t, tt.preset)
			procs := filepath.Join(t.TempDir(), "processes")
			n.SetProcessesFile(procs)
			if tt.busy {
				if err := os.WriteFile(procs, FormatProcesses([]Process{{GPU: 0, PID: 4242, MemoryMiB: 100, SMPercent: 10}}), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if current, pending, ret := d.GetMigMode(); current != 0 || pending != 0 || ret != nvml.SUCCESS {
				t.Fatalf("MIG mode before: %d/%d, %v; want off", current, pending, ret)
			}
			activation, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
			if activation != tt.wantActivation || ret != nvml.SUCCESS {
				t.Fatalf("SetMigMode(enable) = activation %v, %v; want %v, SUCCESS", activation, ret, tt.wantActivation)
			}
			if current, pending, _ := d.GetMigMode(); current != tt.current || pending != tt.pending {
				t.Fatalf("MIG mode after: %d/%d, want %d/%d", current, pending, tt.current, tt.pending)
			}
			if tt.current == 0 {
				if _, ret := createGI(t, d, mustModel(t, d), profileName(t, d, 19), 0); ret != nvml.ERROR_NOT_SUPPORTED {
					t.Fatalf("CreateGpuInstanceWithPlacement before the mode took effect: %v, want ERROR_NOT_SUPPORTED", ret)
				}
				err := n.ResetGPU(0)
				if tt.busy {
					if err == nil || !strings.Contains(err.Error(), "reset GPU 0: in use by 1 process(es)") {
						t.Fatalf("ResetGPU with a process on the GPU: %v", err)
					}
					if err := os.Remove(procs); err != nil {
						t.Fatal(err)
					}
					err = n.ResetGPU(0)
				}
				if err != nil {
					t.Fatalf("ResetGPU: %v", err)
				}
				if current, pending, _ := d.GetMigMode(); current != 1 || pending != 1 {
					t.Fatalf("MIG mode after the reset: %d/%d, want 1/1", current, pending)
				}
			}
		})
	}
}

// mustModel reads a GPU's MIG geometry through NVML, as the plugin does.
func mustModel(t *testing.T, d nvml.Device) mig.Model {
	t.Helper()
	name, _ := d.GetName()
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	m, err := mig.Read(d, name, mem.Total)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func profileName(t *testing.T, d nvml.Device, id int) string {
	t.Helper()
	p, err := mustModel(t, d).ProfileByID(id)
	if err != nil {
		t.Fatal(err)
	}
	return p.Name
}

func TestMIGModeOffRefusesInstances(t *testing.T) {
	_, d, m := gpu0(t, "dgx-h100")
	info := profileInfo(t, d, m, "1g.10gb")
	if _, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("CreateGpuInstanceWithPlacement: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if _, ret := d.GetGpuInstances(&info); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetGpuInstances: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if count, ret := d.GetMaxMigDeviceCount(); count != 0 || ret != nvml.SUCCESS {
		t.Errorf("GetMaxMigDeviceCount: %d, %v; want 0, SUCCESS", count, ret)
	}
	// Placements answer whatever the mode.
	if ps, ret := d.GetGpuInstancePossiblePlacements(&info); ret != nvml.SUCCESS || len(ps) != 7 {
		t.Errorf("GetGpuInstancePossiblePlacements: %v, %v; want 7 placements", ps, ret)
	}

	_, l4, err := func() (*Node, nvml.Device, error) {
		n, err := Load("single-gpu", "node-1")
		if err != nil {
			return nil, nil, err
		}
		d, _ := n.NVML().DeviceGetHandleByIndex(0)
		return n, d, nil
	}()
	if err != nil {
		t.Fatal(err)
	}
	if activation, ret := l4.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("SetMigMode on an L4: %v, %v; want ERROR_NOT_SUPPORTED", activation, ret)
	}
	if _, ret := l4.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetGpuInstanceProfileInfo on an L4: %v, want ERROR_NOT_SUPPORTED", ret)
	}
}

func TestMIGProfileInfo(t *testing.T) {
	_, d, _ := gpu0(t, "dgx-h100")
	for _, tt := range []struct {
		index int
		want  string
		ret   nvml.Return
	}{
		{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, want: "ID 19, 1 slices, 7 instances, 16 SMs, 9984 MiB"},
		{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, want: "ID 20, 1 slices, 1 instances, 16 SMs, 9984 MiB"},
		{index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, want: "ID 15, 1 slices, 4 instances, 26 SMs, 20096 MiB"},
		{index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, want: "ID 9, 3 slices, 2 instances, 60 SMs, 40448 MiB"},
		{index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, want: "ID 0, 7 slices, 1 instances, 132 SMs, 81152 MiB"},
		{index: nvml.GPU_INSTANCE_PROFILE_8_SLICE, ret: nvml.ERROR_NOT_SUPPORTED},
		{index: nvml.GPU_INSTANCE_PROFILE_COUNT, ret: nvml.ERROR_INVALID_ARGUMENT},
	} {
		info, ret := d.GetGpuInstanceProfileInfo(tt.index)
		if ret != tt.ret {
			t.Errorf("profile %d: %v, want %v", tt.index, ret, tt.ret)
			continue
		}
		if ret != nvml.SUCCESS {
			continue
		}
		got := fmt.Sprintf("ID %d, %d slices, %d instances, %d SMs, %d MiB", info.Id, info.SliceCount, info.InstanceCount, info.MultiprocessorCount, info.MemorySizeMB)
		if got != tt.want {
			t.Errorf("profile %d: %s, want %s", tt.index, got, tt.want)
		}
	}
	info, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	ps, ret := d.GetGpuInstancePossiblePlacements(&info)
	if got := fmt.Sprint(ps); ret != nvml.SUCCESS || got != "[{0 4} {4 4}]" {
		t.Errorf("3g.40gb placements: %s, %v; want [{0 4} {4 4}]", got, ret)
	}
}

// TestMIGPlacementPairs creates every pair of (profile, placement) of the
// H100 table, one after the other: the second answers
// ERROR_INSUFFICIENT_RESOURCES exactly when the two overlap or exceed a
// profile's maximum, as pkg/mig's rules say.
func TestMIGPlacementPairs(t *testing.T) {
	_, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	refused := 0
	for _, a := range m.Instances() {
		for _, b := range m.Instances() {
			first, ret := createGI(t, d, m, a.Profile.Name, a.Placement.Start)
			if ret != nvml.SUCCESS {
				t.Fatalf("create %s on an empty GPU: %v", a, ret)
			}
			second, ret := createGI(t, d, m, b.Profile.Name, b.Placement.Start)
			want := nvml.SUCCESS
			if mig.Overlaps(a.Placement, b.Placement) || m.Coexist([]mig.Instance{a, b}) != nil {
				want = nvml.ERROR_INSUFFICIENT_RESOURCES
				refused++
			}
			if ret != want {
				t.Errorf("create %s beside %s: %v, want %v", b, a, ret, want)
			}
			if ret == nvml.SUCCESS {
				if ret := second.Destroy(); ret != nvml.SUCCESS {
					t.Fatalf("destroy %s: %v", b, ret)
				}
			}
			if ret := first.Destroy(); ret != nvml.SUCCESS {
				t.Fatalf("destroy %s: %v", a, ret)
			}
		}
	}
	// Of the 25 x 25 ordered pairs, 213 overlap: summed over each
	// placement, the placements that share a slice with it (the 7g 25,
	// 3g/4g at {0}:4 15 each, 3g at {4}:4 11, the pairs at 0 and 2 9 each,
	// at 4 8, at 6 5, the single slices 0-3 7 each, 4-5 6, 6 5, counting
	// 1g and 1g+me alike). 42 more put a second +me beside a first on
	// another slice.
	if refused != 213+42 {
		t.Errorf("%d pairs refused, want %d", refused, 213+42)
	}
}

func TestMIGPlacementRules(t *testing.T) {
	_, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	for i := 0; i < 7; i++ {
		if _, ret := createGI(t, d, m, "1g.10gb", i); ret != nvml.SUCCESS {
			t.Fatalf("1g.10gb number %d: %v", i+1, ret)
		}
	}
	info := profileInfo(t, d, m, "1g.10gb")
	if _, ret := d.CreateGpuInstance(&info); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("an eighth 1g.10gb: %v, want ERROR_INSUFFICIENT_RESOURCES", ret)
	}
	if _, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 7, Size: 1}); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("1g.10gb at {7}:1, not a placement of it: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	gis, ret := d.GetGpuInstances(&info)
	if ret != nvml.SUCCESS || len(gis) != 7 {
		t.Fatalf("GetGpuInstances: %d, %v; want 7", len(gis), ret)
	}
	var ids []uint32
	for _, gi := range gis {
		gInfo, _ := gi.GetInfo()
		ids = append(ids, gInfo.Id)
	}
	if got := fmt.Sprint(ids); got != "[7 8 9 10 11 12 13]" {
		t.Errorf("GPU instance IDs of seven 1g.10gb: %s, want [7 8 9 10 11 12 13]", got)
	}
}

// TestMIGInstanceIDs: IDs as a real H100 gave them for 3g.40gb at {4}:4
// and 2g.20gb at {0}:2, and the capability minors that follow.
func TestMIGInstanceIDs(t *testing.T) {
	n, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	three, _ := createGI(t, d, m, "3g.40gb", 4)
	two, _ := createGI(t, d, m, "2g.20gb", 0)
	for _, tt := range []struct {
		gi     nvml.GpuInstance
		wantGI uint32
		caps   string
	}{
		{three, 2, "/dev/nvidia-caps/nvidia-cap21 /dev/nvidia-caps/nvidia-cap22"},
		{two, 3, "/dev/nvidia-caps/nvidia-cap30 /dev/nvidia-caps/nvidia-cap31"},
	} {
		gInfo, ret := tt.gi.GetInfo()
		if ret != nvml.SUCCESS || gInfo.Id != tt.wantGI {
			t.Errorf("GPU instance ID %d, %v; want %d", gInfo.Id, ret, tt.wantGI)
		}
		ci, ret := fullCI(t, tt.gi)
		if ret != nvml.SUCCESS {
			t.Fatalf("CreateComputeInstance: %v", ret)
		}
		cInfo, _ := ci.GetInfo()
		if cInfo.Id != 0 || cInfo.GpuInstance != tt.gi || cInfo.Device != d {
			t.Errorf("compute instance %+v, want ID 0 in its GPU instance on GPU 0", cInfo)
		}
	}
	var got []string
	for i := 0; i < 2; i++ {
		md, _ := d.GetMigDeviceHandleByIndex(i)
		uuid, _ := md.GetUUID()
		nodes, err := n.MIGDeviceNodes(uuid)
		if err != nil {
			t.Fatal(err)
		}
		var paths []string
		for _, dn := range nodes {
			paths = append(paths, dn.Path)
			major, minor, err := n.DeviceNumbers(dn.Path)
			if err != nil || major != dn.Major || minor != dn.Minor {
				t.Errorf("DeviceNumbers(%s) = %d:%d, %v; want %d:%d", dn.Path, major, minor, err, dn.Major, dn.Minor)
			}
		}
		got = append(got, strings.Join(paths, " "))
	}
	want := []string{
		"/dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-caps/nvidia-cap21 /dev/nvidia-caps/nvidia-cap22",
		"/dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-caps/nvidia-cap30 /dev/nvidia-caps/nvidia-cap31",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("device nodes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := n.MIGDeviceNodes("MIG-00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("MIGDeviceNodes of an unknown UUID: no error")
	}
}

func TestMIGMinorsFile(t *testing.T) {
	n, err := Load("dgx-h100", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	m, err := mig.ParseMinors(n.MIGMinorsFile(), "mig-minors")
	if err != nil {
		t.Fatal(err)
	}
	if m.Config != 1 || m.Monitor != 2 || m.Len() != 8*15*9 {
		t.Errorf("config %d, monitor %d, %d capabilities; want 1, 2, %d", m.Config, m.Monitor, m.Len(), 8*15*9)
	}
	for _, tt := range []struct {
		gpu, gi, ci, want int
	}{
		{0, 0, -1, 3}, {0, 0, 0, 4}, {0, 0, 7, 11}, {0, 1, -1, 12}, {0, 1, 0, 13},
		{0, 14, 7, 137}, {1, 0, -1, 138}, {7, 14, 7, 3 + 8*135 - 1},
	} {
		var got int
		if tt.ci < 0 {
			got, _ = m.GPUInstance(tt.gpu, tt.gi)
		} else {
			got, _ = m.ComputeInstance(tt.gpu, tt.gi, tt.ci)
		}
		if got != tt.want {
			t.Errorf("gpu%d gi%d ci%d: minor %d, want %d", tt.gpu, tt.gi, tt.ci, got, tt.want)
		}
	}
	for _, p := range []string{"/dev/nvidia-caps/nvidia-cap0", "/dev/nvidia-caps/nvidia-cap1083", "/dev/nvidia-cap12"} {
		if _, _, err := n.DeviceNumbers(p); err == nil {
			t.Errorf("DeviceNumbers(%s): no error for a node the simulated node lacks", p)
		}
	}
}
