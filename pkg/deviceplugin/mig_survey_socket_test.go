package deviceplugin

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// adminInstance makes a GPU instance on GPU gpu as nvidia-smi mig -cgi
// does, of GPU-instance profile index gi at {start}:size, with a compute
// instance of profile index ci in it (none where ci < 0).
func (e *env) adminInstance(gpu, gi, ci, start, size int) {
	e.t.Helper()
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	info, ret := dev.GetGpuInstanceProfileInfo(gi)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	g, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(size)})
	if ret != nvml.SUCCESS {
		e.t.Fatalf("make GPU instance at {%d}:%d: %v", start, size, ret)
	}
	if ci < 0 {
		return
	}
	ciInfo, ret := g.GetComputeInstanceProfileInfo(ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	if _, ret := g.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
}

// lastHealth is the health of each seat of resource in the last list
// the kubelet got, by seat ID.
func (e *env) lastHealth(resource string) map[string]string {
	e.t.Helper()
	lists := e.kubelet.listsOf(resource)
	if len(lists) == 0 {
		e.t.Fatalf("%s: no list sent", resource)
	}
	out := map[string]string{}
	for _, d := range lists[len(lists)-1] {
		out[d.ID] = d.Health
	}
	return out
}

// Instances the shim did not make at placements its seats overlap (an
// administrator's instance of another profile, one of a seat's profile
// without the compute instance a seat's has) make those seats impossible:
// they are served Unhealthy, so the kubelet never hands them out, and an
// Allocate of one anyway fails naming the instance, without touching it.
// A whole instance of a seat's profile at its placement stays the seat's
// (adopted), and the other seats are served and made as before.
func TestMIGSeatsBlockedByAnInstanceAreUnhealthyOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migShimConfig)
	// GPU 1's seats are 1g.10gb at 6, 5 and 4; GPU 0's 3g.40gb at 4 and
	// 1g.10gb at 3, 2 and 1.
	e.adminInstance(1, nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 4, 2)
	e.adminInstance(0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, -1, 2, 1)
	e.adminInstance(0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 3, 1)
	before := [][]string{e.gpuInstances(0), e.gpuInstances(1)}
	e.start(e.withMIG)

	want := map[string]map[string]string{
		"kyb.ai/mig-1g.10gb": {
			"g0-mig-1g-10gb-3": pluginapi.Healthy, "g0-mig-1g-10gb-2": pluginapi.Unhealthy, "g0-mig-1g-10gb-1": pluginapi.Healthy,
			"g1-mig-1g-10gb-6": pluginapi.Healthy, "g1-mig-1g-10gb-5": pluginapi.Unhealthy, "g1-mig-1g-10gb-4": pluginapi.Unhealthy,
		},
		"kyb.ai/mig-3g.40gb": {"g0-mig-3g-40gb-4": pluginapi.Healthy},
	}
	for resource, health := range want {
		if got := e.lastHealth(resource); !maps.Equal(got, health) {
			t.Errorf("%s: seats %v, want %v", resource, got, health)
		}
	}

	// The kubelet hands out no Unhealthy seat; asked anyway, the shim
	// names what blocks it.
	_, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g1-mig-1g-10gb-5"})
	if err == nil || !strings.Contains(err.Error(), "seat g1-mig-1g-10gb-5 cannot be made: MIG instance") || !strings.Contains(err.Error(), "at {4}:2 on GPU 1") {
		t.Errorf("Allocate of a blocked seat: %v, want an error naming the 2g instance at {4}:2", err)
	}
	_, err = allocate(e, "kyb.ai/mig-1g.10gb", []string{"g0-mig-1g-10gb-2"})
	if err == nil || !strings.Contains(err.Error(), "holds 0 compute instances") {
		t.Errorf("Allocate of a seat whose placement holds an instance without a compute instance: %v", err)
	}
	if _, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g1-mig-1g-10gb-6"}, []string{"g0-mig-1g-10gb-3"}); err != nil {
		t.Fatalf("Allocate of seats nothing blocks: %v", err)
	}
	if got, want := e.gpuInstances(0), before[0]; !slices.Equal(got, want) {
		t.Errorf("GPU 0's instances %v, want only the administrator's %v (seat 3 adopts its instance)", got, want)
	}
	if got, want := e.gpuInstances(1), append(slices.Clone(before[1]), "19@{6}:1"); !slices.Equal(got, want) {
		t.Errorf("GPU 1's instances %v, want the administrator's and seat 6's %v", got, want)
	}
}

// migEarlierConfig gives GPU 1 three 1g.10gb seats (6, 5 and 4);
// migLaterConfig gives it three 2g.20gb seats (4, 2 and 0) instead.
const (
	migEarlierConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 3}, gpus: [1]}
`
	migLaterConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-2g.20gb, mig: {profile: 2g.20gb, seatsPerGPU: 3}, gpus: [1]}
`
)

// After the configuration changed, the shim destroys at start the
// instances it made for seats the configuration no longer has, once no
// container holds them (the kubelet's PodResources API says which), and
// the instances the DRA plugin left on a node no pod of it holds: the
// new seats at their placements can be made. An instance a container
// still holds stays until it is released.
func TestMIGShimDestroysInstancesOfAnEarlierConfigurationOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migEarlierConfig)
	kubelet := podresourcestest.Start(t, filepath.Join(sockettest.Dir(t), "kubelet.sock"))
	asked := withPodResources(t, kubelet.Socket)
	e.start(e.withMIG, asked)
	if _, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g1-mig-1g-10gb-4"}, []string{"g1-mig-1g-10gb-6"}); err != nil {
		t.Fatal(err)
	}
	e.plugin.Stop()
	// The DRA plugin served the node once: a released claim's instance is
	// left at {2}:2 (a crash before its unprepare).
	m, err := miginstance.New(miginstance.Options{Dir: driver.PluginDir(e.pluginsDir), NVML: e.sim.NVML(), Minors: func() ([]byte, error) { return e.sim.MIGMinorsFile(), nil }, BootID: "boot-1"})
	if err != nil {
		t.Fatal(err)
	}
	later := e.planOf(migLaterConfig)
	i := slices.IndexFunc(later.MIGDevices(), func(d planner.MIGDevice) bool { return d.DeviceName() == "g1-mig-2g-20gb-2" })
	if i < 0 {
		t.Fatalf("no seat g1-mig-2g-20gb-2 in %v", later.MIGDevices())
	}
	d, gpu := later.MIGDevices()[i], e.inv.GPUs[1]
	if _, err := m.Ensure(e.ctx, miginstance.Want{Claim: types.UID("8d1f3c2e-0b4a-4f6e-9c7d-1a2b3c4d5e6f"), Device: d.DeviceName(), GPU: 1, GPUMinor: gpu.Minor, GPUUUID: gpu.UUID,
		Architecture: gpu.Architecture, Profile: d.GPU.Profile, Placement: d.Placement}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.gpuInstances(1), []string{"14@{2}:2", "19@{4}:1", "19@{6}:1"}; !slices.Equal(got, want) {
		t.Fatalf("GPU 1's instances before the change %v, want %v", got, want)
	}

	// A pod still holds seat 6 of the earlier configuration.
	kubelet.SetPodResources(holding("team-a", "old", "kyb.ai/mig-1g.10gb", "g1-mig-1g-10gb-6"))
	e.restartWith(later, e.withMIG, asked)
	if got, want := e.gpuInstances(1), []string{"19@{6}:1"}; !slices.Equal(got, want) {
		t.Errorf("GPU 1's instances after the change %v, want only the held seat's %v", got, want)
	}
	health := map[string]string{"g1-mig-2g-20gb-4": pluginapi.Healthy, "g1-mig-2g-20gb-2": pluginapi.Healthy, "g1-mig-2g-20gb-0": pluginapi.Healthy}
	if got := e.lastHealth("kyb.ai/mig-2g.20gb"); !maps.Equal(got, health) {
		t.Errorf("seats %v, want %v", got, health)
	}
	if _, err := allocate(e, "kyb.ai/mig-2g.20gb", []string{"g1-mig-2g-20gb-4"}, []string{"g1-mig-2g-20gb-2"}); err != nil {
		t.Fatalf("Allocate of the new seats where the old instances were: %v", err)
	}

	// Released, the held seat's instance goes at the next start.
	kubelet.RemovePod("team-a", "old")
	e.restartWith(later, e.withMIG, asked)
	if got, want := e.gpuInstances(1), []string{"14@{2}:2", "14@{4}:2"}; !slices.Equal(got, want) {
		t.Errorf("GPU 1's instances once the old seat was released %v, want the new seats' %v", got, want)
	}
}

// Where the kubelet is not asked, no made instance is destroyed at start:
// the earlier configuration's instance stays, and the seat it overlaps is
// served Unhealthy rather than handed out to fail.
func TestMIGShimNotAskingTheKubeletDestroysNothingOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migEarlierConfig)
	e.start(e.withMIG)
	if _, err := allocate(e, "kyb.ai/mig-1g.10gb", []string{"g1-mig-1g-10gb-4"}); err != nil {
		t.Fatal(err)
	}
	e.plugin.Stop()
	e.restartWith(e.planOf(migLaterConfig), e.withMIG)
	if got, want := e.gpuInstances(1), []string{"19@{4}:1"}; !slices.Equal(got, want) {
		t.Errorf("GPU 1's instances %v, want the earlier seat's %v", got, want)
	}
	health := map[string]string{"g1-mig-2g-20gb-4": pluginapi.Unhealthy, "g1-mig-2g-20gb-2": pluginapi.Healthy, "g1-mig-2g-20gb-0": pluginapi.Healthy}
	if got := e.lastHealth("kyb.ai/mig-2g.20gb"); !maps.Equal(got, health) {
		t.Errorf("seats %v, want %v", got, health)
	}
}

// planOf plans the env's node with another configuration.
func (e *env) planOf(config string) *planner.Plan {
	e.t.Helper()
	plan, err := planner.New(e.inv, simnodetest.Config(e.t, config))
	if err != nil {
		e.t.Fatal(err)
	}
	return plan
}

// restartWith starts the shim again on the same node and directories with
// another plan, before a kubelet that forgot the earlier lists.
func (e *env) restartWith(plan *planner.Plan, mutate ...func(*Options)) {
	e.t.Helper()
	e.plugin.Stop()
	e.plan = plan
	e.kubelet.stop()
	e.kubelet = newFakeKubelet(e.t, e.dir)
	e.start(mutate...)
}

// A GPU given to a MIG profile on an architecture whose MIG mode changes
// need a GPU reset (Ampere), and not in MIG mode, can make none of its
// seats until an administrator resets it: every Allocate fails naming the
// reset. Such seats are not served Healthy, as the DRA plugin publishes no
// MIG device of such a GPU, or the kubelet hands them out and each pod
// fails admission over and over.
func TestMIGSeatsOnAmpereWithMIGOffAreNotServedHealthy(t *testing.T) {
	e := newEnv(t, "dgx-a100", `
profiles:
- {resource: kyb.ai/mig-1g.5gb, mig: {profile: 1g.5gb}, gpus: [0]}
`)
	e.start(e.withMIG)
	health := e.lastHealth("kyb.ai/mig-1g.5gb")
	if len(health) == 0 {
		t.Fatal("no seat served")
	}
	for id, h := range health {
		if h != pluginapi.Unhealthy {
			t.Errorf("seat %s is served %s on an Ampere GPU with MIG mode off, whose instances cannot be made without a GPU reset", id, h)
		}
	}
	if _, err := allocate(e, "kyb.ai/mig-1g.5gb", []string{"g0-mig-1g-5gb-6"}); err == nil || !strings.Contains(err.Error(), "-mig 1") {
		t.Fatalf("Allocate: %v, want the reset it needs", err)
	}
}
