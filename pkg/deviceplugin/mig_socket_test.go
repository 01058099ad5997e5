package deviceplugin

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// migShimConfig gives GPU 0 to two MIG profiles and GPU 1 to one; the
// whole-GPU profile keeps the other GPUs.
const migShimConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 3}, gpus: [0, 1]}
- {resource: kyb.ai/mig-3g.40gb, mig: {profile: 3g.40gb, seatsPerGPU: 1}, gpus: [0]}
`

func (e *env) withMIG(o *Options) {
	o.MIG = MIG{NVML: e.sim.NVML(), Minors: func() ([]byte, error) { return e.sim.MIGMinorsFile(), nil }, Dir: driver.PluginDir(e.pluginsDir), BootID: "boot-1"}
}

// gpuInstances lists GPU i's GPU instances as "profileID@{start}:size",
// sorted.
func (e *env) gpuInstances(i int) []string {
	e.t.Helper()
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	var out []string
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			return nil
		}
		for _, gi := range gis {
			g, _ := gi.GetInfo()
			out = append(out, fmt.Sprintf("%d@{%d}:%d", g.ProfileId, g.Placement.Start, g.Placement.Size))
		}
	}
	slices.Sort(out)
	return out
}

func seatIDs(devs []*pluginapi.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.ID)
	}
	return out
}

func TestMIGProfilesAreResourcesOfDisjointSeatsOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migShimConfig)
	e.start(e.withMIG)
	if got, want := e.plugin.Resources(), []string{"kyb.ai/gpu-1x-seat", "kyb.ai/mig-1g.10gb", "kyb.ai/mig-3g.40gb"}; !slices.Equal(got, want) {
		t.Fatalf("resources %v, want %v", got, want)
	}
	tests := []struct {
		resource string
		want     []string
	}{
		// GPUs 0 and 1 serve MIG seats, not whole-GPU ones.
		{"kyb.ai/gpu-1x-seat", []string{"g2-1x-seat-0", "g3-1x-seat-0", "g4-1x-seat-0", "g5-1x-seat-0", "g6-1x-seat-0", "g7-1x-seat-0"}},
		// On GPU 0 the 3g.40gb seat takes slices 4-7 ({4}:4, the last of
		// its placements), so the 1g.10gb seats take 3, 2 and 1; on GPU 1
		// 6, 5 and 4.
		{"kyb.ai/mig-1g.10gb", []string{"g0-mig-1g-10gb-3", "g0-mig-1g-10gb-2", "g0-mig-1g-10gb-1", "g1-mig-1g-10gb-6", "g1-mig-1g-10gb-5", "g1-mig-1g-10gb-4"}},
		{"kyb.ai/mig-3g.40gb", []string{"g0-mig-3g-40gb-4"}},
	}
	for _, tt := range tests {
		lists := e.kubelet.listsOf(tt.resource)
		if len(lists) == 0 {
			t.Errorf("%s: no list sent", tt.resource)
			continue
		}
		if got := seatIDs(lists[len(lists)-1]); !slices.Equal(got, tt.want) {
			t.Errorf("%s advertises %v, want %v", tt.resource, got, tt.want)
		}
	}

	// One container with two 1g.10gb seats, one with the 3g.40gb seat:
	// each instance is made at its seat's placement, and the container
	// gets what a DRA prepare gives a claim of the same devices.
	resp, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g0-mig-1g-10gb-3", "g1-mig-1g-10gb-6"})
	if err != nil {
		t.Fatal(err)
	}
	big, err := allocate(e, "kyb.ai/mig-3g.40gb", []string{"g0-mig-3g-40gb-4"})
	if err != nil {
		t.Fatal(err)
	}
	// Profile IDs: 1g.10gb 19, 3g.40gb 9 (H100-80GB).
	if got, want := e.gpuInstances(0), []string{"19@{3}:1", "9@{4}:4"}; !slices.Equal(got, want) {
		t.Errorf("GPU 0's instances %v, want %v", got, want)
	}
	if got, want := e.gpuInstances(1), []string{"19@{6}:1"}; !slices.Equal(got, want) {
		t.Errorf("GPU 1's instances %v, want %v", got, want)
	}
	c := resp.ContainerResponses[0]
	migs := strings.Split(c.Envs["CUDA_VISIBLE_DEVICES"], ",")
	if len(migs) != 2 || !strings.HasPrefix(migs[0], "MIG-") || !strings.HasPrefix(migs[1], "MIG-") || c.Envs["NVIDIA_VISIBLE_DEVICES"] != c.Envs["CUDA_VISIBLE_DEVICES"] {
		t.Fatalf("env %v, want two MIG devices in CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES", c.Envs)
	}
	for k, want := range map[string]string{"KYB_GPU_GROUP": "G0,G1", "KYB_GPU_SEAT": "3,6", "KYB_SEAT_GEN": "1,1"} {
		if c.Envs[k] != want {
			t.Errorf("%s=%q, want %q", k, c.Envs[k], want)
		}
	}
	var wantNodes []string
	for _, uuid := range migs {
		nodes, err := e.sim.MIGDeviceNodes(uuid)
		if err != nil {
			t.Fatalf("the container's MIG device %s: %v", uuid, err)
		}
		for _, n := range nodes {
			if !slices.Contains(wantNodes, n.Path) {
				wantNodes = append(wantNodes, n.Path)
			}
		}
	}
	var gotNodes []string
	for _, d := range c.Devices {
		gotNodes = append(gotNodes, d.ContainerPath)
	}
	slices.Sort(wantNodes)
	slices.Sort(gotNodes)
	if !slices.Equal(gotNodes, wantNodes) {
		t.Errorf("device nodes %v, want the instances' %v", gotNodes, wantNodes)
	}
	if env := big.ContainerResponses[0].Envs; env["KYB_GPU_SEAT"] != "4" || !strings.HasPrefix(env["CUDA_VISIBLE_DEVICES"], "MIG-") {
		t.Errorf("3g.40gb container env %v", env)
	}

	// The seat's next holder gets the same instance, at the next
	// generation; nothing more is made.
	again, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g0-mig-1g-10gb-3"})
	if err != nil {
		t.Fatal(err)
	}
	if env := again.ContainerResponses[0].Envs; env["CUDA_VISIBLE_DEVICES"] != migs[0] || env["KYB_SEAT_GEN"] != "2" {
		t.Errorf("the seat handed out again: %v, want %s at generation 2", env, migs[0])
	}
	if got := e.gpuInstances(0); len(got) != 2 {
		t.Errorf("GPU 0's instances after the seat's second hand-out: %v", got)
	}
}

func TestMIGSeatKeepsItsInstanceAcrossAShimRestartWithCDI(t *testing.T) {
	e := newEnv(t, "dgx-h100", migShimConfig)
	cdiInjection := func(o *Options) {
		e.withMIG(o)
		o.Injection = InjectionCDI
		o.Edits = containeredits.Options{DeviceNumbers: e.sim.DeviceNumbers}
	}
	e.start(cdiInjection)
	first, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g1-mig-1g-10gb-5"})
	if err != nil {
		t.Fatal(err)
	}
	if got := first.ContainerResponses[0].CdiDevices; len(got) != 1 || !strings.Contains(got[0].Name, "g1-mig-1g-10gb-5") {
		t.Fatalf("CDI devices %v, want the seat's spec", got)
	}
	spec, err := filepath.Glob(filepath.Join(e.cdiDir, "*g1-mig-1g-10gb-5*"))
	if err != nil || len(spec) != 1 {
		t.Fatalf("the seat's CDI spec: %v %v", spec, err)
	}
	e.plugin.Stop()
	e.startPlugin(cdiInjection)
	e.waitRegistered(2 * len(e.plugin.Resources()))
	if _, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g1-mig-1g-10gb-5"}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.gpuInstances(1), []string{"19@{5}:1"}; !slices.Equal(got, want) {
		t.Errorf("GPU 1's instances after a restart and the seat's second hand-out: %v, want %v", got, want)
	}
}

func TestMIGSeatAdoptsAnAdministratorsInstanceOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migShimConfig)
	// An administrator partitioned GPU 1 beforehand: 1g.10gb at {5}:1
	// with one compute instance, as nvidia-smi mig -cgi 19 -C makes it.
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(1)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	info, ret := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 5, Size: 1})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	md, ret := dev.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	static, _ := md.GetUUID()

	e.start(e.withMIG)
	resp, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g1-mig-1g-10gb-5"})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.ContainerResponses[0].Envs["CUDA_VISIBLE_DEVICES"]; got != static {
		t.Errorf("CUDA_VISIBLE_DEVICES=%s, want the administrator's instance %s", got, static)
	}
	if got, want := e.gpuInstances(1), []string{"19@{5}:1"}; !slices.Equal(got, want) {
		t.Errorf("GPU 1's instances %v, want only the administrator's %v", got, want)
	}
}

func TestMIGAllocateOnAmpereWithMIGOffFailsNamingTheFix(t *testing.T) {
	e := newEnv(t, "dgx-a100", `
profiles:
- {resource: kyb.ai/mig-1g.5gb, mig: {profile: 1g.5gb}, gpus: [0]}
`)
	e.start(e.withMIG)
	_, err := allocate(e, "kyb.ai/mig-1g.5gb", []string{"g0-mig-1g-5gb-6"})
	if err == nil || !strings.Contains(err.Error(), "nvidia-smi -i 0 -mig 1") {
		t.Fatalf("Allocate on an Ampere GPU with MIG off: %v, want the reset it needs", err)
	}
	if got := e.gpuInstances(0); len(got) != 0 {
		t.Errorf("instances %v after a failed Allocate", got)
	}
}

func TestMIGPlanWithoutNVMLIsRefused(t *testing.T) {
	e := newEnv(t, "dgx-h100", migShimConfig)
	if _, err := e.tryStart(); err == nil || !strings.Contains(err.Error(), "no NVML") {
		t.Fatalf("start without NVML: %v", err)
	}
}
