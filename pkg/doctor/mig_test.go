package doctor

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// migNode is a simulated node opened for the doctor, whose MIG state a
// test makes first: through the plugin's own instance maker and journal,
// or through NVML as an administrator would.
type migNode struct {
	*node
	host *gpuhost.Host
}

func newMIGNode(t *testing.T, preset, config string) *migNode {
	t.Helper()
	n := newNode(t)
	n.opts.Node.Simulate = preset
	n.opts.Node.ConfigPath = n.write(filepath.Join(n.root, "config.yaml"), config)
	_, ctx := ktesting.NewTestContext(t)
	host, err := n.opts.Node.OpenHost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close() })
	n.opts.Host = host
	return &migNode{node: n, host: host}
}

func (m *migNode) device(t *testing.T, gpu int) nvml.Device {
	t.Helper()
	d, ret := m.host.NVML.DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return d
}

// setMode asks for a MIG mode as nvidia-smi -mig does; on Ampere it stays
// pending until a reset.
func (m *migNode) setMode(t *testing.T, gpu, mode int) {
	t.Helper()
	if _, ret := m.device(t, gpu).SetMigMode(mode); ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v", ret)
	}
}

// pluginInstance makes an instance as the plugin's prepare does, with its
// journal record in the plugin's directory.
func (m *migNode) pluginInstance(ctx context.Context, t *testing.T, claim string, gpu int, profile string, start int, adopt bool) miginstance.Instance {
	t.Helper()
	m.mkdir(driver.PluginDir(m.opts.PluginsDir))
	mgr, err := miginstance.New(miginstance.Options{Dir: driver.PluginDir(m.opts.PluginsDir), NVML: m.host.NVML, Minors: m.host.MIGMinors, BootID: "boot-1"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := simnodetest.MIGModel(t, m.device(t, gpu)).Profile(profile)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := mgr.Ensure(ctx, miginstance.Want{Claim: types.UID(claim), Device: fmt.Sprintf("g%d-mig-%s-%d", gpu, strings.ReplaceAll(profile, ".", "-"), start),
		GPU: gpu, GPUMinor: gpu, GPUUUID: "GPU-x", Architecture: "hopper", Profile: p, Placement: mig.Placement{Start: start, Size: p.MemorySlices}, Adopt: adopt})
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// foreignInstance makes a 1-slice GPU instance at start, with its compute
// instance where withCI, as an administrator's nvidia-smi mig -cgi does.
func (m *migNode) foreignInstance(t *testing.T, gpu, start int, withCI bool) {
	t.Helper()
	d := m.device(t, gpu)
	info, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: 1})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if !withCI {
		return
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
}

func hasDetail(c Check, want string) bool {
	for _, d := range c.Details {
		if strings.Contains(d, want) {
			return true
		}
	}
	return false
}

func TestMIGCheckPartitionsAgainstConfigurationAndJournal(t *testing.T) {
	m := newMIGNode(t, "dgx-h100", `profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 4}, gpus: [0, 1]}
`)
	_, ctx := ktesting.NewTestContext(t)
	// GPU 0: the plugin's 1g.10gb at {6}:1 (GI 13, CI 0); an
	// administrator's 1g.10gb at {0}:1 (GI 7) with a compute instance (a
	// static seat), one at {2}:1 (GI 9) that a claim adopted, and one at
	// {1}:1 (GI 8) without a compute instance. GPU 1: MIG off (Hopper: the
	// plugin turns it on). GPU 2: in the 1x groups, MIG on.
	inst := m.pluginInstance(ctx, t, "claim-1", 0, "1g.10gb", 6, false)
	m.foreignInstance(t, 0, 0, true)
	m.foreignInstance(t, 0, 1, false)
	m.foreignInstance(t, 0, 2, true)
	m.pluginInstance(ctx, t, "claim-2", 0, "1g.10gb", 2, true)
	m.setMode(t, 2, nvml.DEVICE_MIG_ENABLE)

	r := m.run(t)
	if plan := check(t, r, "plan"); !hasDetail(plan, "kyb.ai/mig-1g.10gb: MIG 1g.10gb instances on 2 GPUs: GPU 0: 4 seats, GPU 1: 4 seats") {
		t.Errorf("plan: %+v", plan)
	}
	gpu0 := check(t, r, "mig-gpu0")
	if gpu0.Status != Warn || gpu0.Summary != "GPU 0 (NVIDIA H100 80GB HBM3, hopper): MIG mode on; profiles 1g.10gb; 4 GPU instances" {
		t.Errorf("mig-gpu0: %s %q", gpu0.Status, gpu0.Summary)
	}
	for _, want := range []string{
		"GI 7: 1g.10gb at {0}:1, CI 0 MIG-",
		": not made by the plugin; a static seat, published as such and never destroyed",
		"GI 8: 1g.10gb at {1}:1, no compute instance: not made by the plugin, not a static seat: it holds no compute instance, or several, or one smaller than it; left as it is",
		"GI 9: 1g.10gb at {2}:1, CI 0 MIG-",
		": a static seat (not made by the plugin), adopted by claim claim-2 device g0-mig-1g-10gb-2",
		"GI 13: 1g.10gb at {6}:1, CI 0 " + inst.UUID + ": the plugin's, claim claim-1 device g0-mig-1g-10gb-6",
		// capMinor: 3 + GPU minor × 135 + GI × 9 (+ 1 + CI).
		"GI 7 capabilities: gpu0/gi7/access /dev/nvidia-caps/nvidia-cap66, gpu0/gi7/ci0/access /dev/nvidia-caps/nvidia-cap67",
		"GI 8 capabilities: gpu0/gi8/access /dev/nvidia-caps/nvidia-cap75",
		"GI 13 capabilities: gpu0/gi13/access /dev/nvidia-caps/nvidia-cap120, gpu0/gi13/ci0/access /dev/nvidia-caps/nvidia-cap121",
	} {
		if !hasDetail(gpu0, want) {
			t.Errorf("mig-gpu0 lacks %q", want)
		}
	}
	if !strings.Contains(gpu0.Fix, "the plugin never touches an instance it did not make, and publishes neither the MIG devices it overlaps nor the GPU's whole-GPU groups") {
		t.Errorf("mig-gpu0 fix: %q", gpu0.Fix)
	}
	if gpu1 := check(t, r, "mig-gpu1"); gpu1.Status != OK || gpu1.Summary != "GPU 1 (NVIDIA H100 80GB HBM3, hopper): MIG mode off; profiles 1g.10gb" {
		t.Errorf("mig-gpu1: %s %q", gpu1.Status, gpu1.Summary)
	}
	gpu2 := check(t, r, "mig-gpu2")
	if gpu2.Status != Fail || gpu2.Summary != "GPU 2 (NVIDIA H100 80GB HBM3): MIG mode on; no MIG profile of the configuration has this GPU; 0 GPU instances" ||
		!strings.Contains(gpu2.Fix, "sees no CUDA device while MIG mode is on") {
		t.Errorf("mig-gpu2: %+v", gpu2)
	}
	for _, c := range r.Checks {
		if c.Name == "mig-gpu3" {
			t.Errorf("GPU 3 has neither a MIG profile nor MIG mode, yet: %+v", c)
		}
	}
	// The doctor left every instance as it was.
	d := m.device(t, 0)
	if n, _ := d.GetMaxMigDeviceCount(); n != 7 {
		t.Fatalf("GPU 0 MIG device slots: %d", n)
	}
	if got := countInstances(t, d); got != 4 {
		t.Errorf("GPU 0 holds %d GPU instances after the doctor, want 4", got)
	}
}

func countInstances(t *testing.T, d nvml.Device) int {
	t.Helper()
	info, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gis, ret := d.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return len(gis)
}

func TestMIGCheckModeOnAmpere(t *testing.T) {
	config := `profiles:
- {resource: kyb.ai/mig-1g.5gb, mig: {profile: 1g.5gb}, gpus: [0, 1, 2]}
`
	m := newMIGNode(t, "dgx-a100", config)
	// GPU 0: off. GPU 1: on asked for, pending a reset. GPU 2: on, off
	// pending. GPU 3: no MIG profile, on pending.
	m.setMode(t, 1, nvml.DEVICE_MIG_ENABLE)
	m.setMode(t, 2, nvml.DEVICE_MIG_ENABLE)
	if err := m.host.Simulated.ResetGPU(2); err != nil {
		t.Fatal(err)
	}
	m.setMode(t, 2, nvml.DEVICE_MIG_DISABLE)
	m.setMode(t, 3, nvml.DEVICE_MIG_ENABLE)
	r := m.run(t)
	tests := []struct {
		check, status, summary, fix string
	}{
		{"mig-gpu0", "fail", "GPU 0 (NVIDIA A100-SXM4-40GB, ampere): MIG mode off; profiles 1g.5gb", "drain the GPU, then nvidia-smi -i 0 -mig 1 and nvidia-smi -i 0 --gpu-reset"},
		{"mig-gpu1", "fail", "GPU 1 (NVIDIA A100-SXM4-40GB, ampere): MIG mode off, on pending (at the GPU's next reset); profiles 1g.5gb", "drain the GPU, then nvidia-smi -i 1 --gpu-reset"},
		{"mig-gpu2", "warn", "GPU 2 (NVIDIA A100-SXM4-40GB, ampere): MIG mode on, off pending (at the GPU's next reset); profiles 1g.5gb; 0 GPU instances", "cancel the change (nvidia-smi -i 2 -mig 1)"},
		{"mig-gpu3", "warn", "GPU 3 (NVIDIA A100-SXM4-40GB): MIG mode off, on pending (at the GPU's next reset); no MIG profile of the configuration has this GPU", "cancel it (nvidia-smi -i 3 -mig 0)"},
	}
	for _, tt := range tests {
		c := check(t, r, tt.check)
		if string(c.Status) != tt.status || c.Summary != tt.summary || !strings.Contains(c.Fix, tt.fix) {
			t.Errorf("%s: %s %q, fix %q; want %s %q, fix with %q", tt.check, c.Status, c.Summary, c.Fix, tt.status, tt.summary, tt.fix)
		}
	}
	if !r.Failed() {
		t.Error("an Ampere GPU given to MIG with MIG off must fail the report")
	}
}

func TestMIGCapabilityNodes(t *testing.T) {
	minors, err := mig.ParseMinors([]byte("config 1\nmonitor 2\ngpu0/gi7/access 66\ngpu0/gi7/ci0/access 67\ngpu0/gi8/access 75\n"), "mig-minors")
	if err != nil {
		t.Fatal(err)
	}
	instances := []migInstance{{gi: 7, cis: []migComputeInstance{{ci: 0}}}, {gi: 8, cis: []migComputeInstance{{ci: 0}}}}
	tests := []struct {
		name       string
		nodes      map[string]capNode
		wantStatus Status
		wantLines  []string
		wantFix    string
	}{
		{
			name: "nodes of the listed numbers",
			nodes: map[string]capNode{
				"/dev/nvidia-caps/nvidia-cap66": {exists: true, major: 238, minor: 66},
				"/dev/nvidia-caps/nvidia-cap67": {exists: true, major: 238, minor: 67},
				"/dev/nvidia-caps/nvidia-cap75": {exists: true, major: 238, minor: 75},
			},
			wantStatus: Fail, // gi8/ci0 is not in mig-minors
			wantLines: []string{
				"GI 7 capabilities: gpu0/gi7/access /dev/nvidia-caps/nvidia-cap66, gpu0/gi7/ci0/access /dev/nvidia-caps/nvidia-cap67",
				"GI 8 capabilities: gpu0/gi8/access /dev/nvidia-caps/nvidia-cap75, gpu0/gi8/ci0/access not in mig-minors",
			},
			wantFix: "mig-minors does not list an existing instance's capability",
		},
		{
			name: "a missing node and one of other numbers",
			nodes: map[string]capNode{
				"/dev/nvidia-caps/nvidia-cap66": {exists: true, major: 238, minor: 67},
				"/dev/nvidia-caps/nvidia-cap75": {exists: true, notChar: "not a character device (mode 100000)"},
			},
			wantStatus: Fail,
			wantLines: []string{
				"GI 7 capabilities: gpu0/gi7/access 66: /dev/nvidia-caps/nvidia-cap66 is 238:67, want 238:66, gpu0/gi7/ci0/access 67: /dev/nvidia-caps/nvidia-cap67 missing",
				"GI 8 capabilities: gpu0/gi8/access 75: /dev/nvidia-caps/nvidia-cap75 is not a character device (mode 100000), gpu0/gi8/ci0/access not in mig-minors",
			},
			wantFix: "gives a container another instance's capability, or none",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host := capsHost{
				node:  func(p string) (capNode, error) { return tt.nodes[p], nil },
				major: func() (int64, error) { return 238, nil },
			}
			lines, status, fix := capabilityLines(minors, host, 0, instances)
			if status != tt.wantStatus || strings.Join(lines, "\n") != strings.Join(tt.wantLines, "\n") || !strings.Contains(fix, tt.wantFix) {
				t.Errorf("got %s\n%s\nfix %q\nwant %s\n%s\nfix with %q", status, strings.Join(lines, "\n"), fix, tt.wantStatus, strings.Join(tt.wantLines, "\n"), tt.wantFix)
			}
		})
	}
	t.Run("only missing nodes warn", func(t *testing.T) {
		host := capsHost{node: func(string) (capNode, error) { return capNode{}, nil }, major: func() (int64, error) { return 238, nil }}
		_, status, fix := capabilityLines(minors, host, 0, instances[:1])
		if status != Warn || !strings.Contains(fix, "mknod") {
			t.Errorf("got %s, fix %q; want warn with mknod", status, fix)
		}
	})
}

// destroyCI destroys the compute instances of the GPU instance at start
// (1-slice profile), as an administrator's nvidia-smi mig -dci does, and
// makes a new one where remake.
func (m *migNode) destroyCI(t *testing.T, gpu, start int, remake bool) {
	t.Helper()
	d := m.device(t, gpu)
	info, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gis, ret := d.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	for _, gi := range gis {
		gInfo, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		if int(gInfo.Placement.Start) != start {
			continue
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		cis, ret := gi.GetComputeInstances(&ciInfo)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
		}
		if remake {
			if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
		}
		return
	}
	t.Fatalf("GPU %d has no 1-slice GPU instance at %d", gpu, start)
}

// destroyGI destroys the 1-slice GPU instance at start, as nvidia-smi mig
// -dgi does.
func (m *migNode) destroyGI(t *testing.T, gpu, start int) {
	t.Helper()
	d := m.device(t, gpu)
	info, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gis, ret := d.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	for _, gi := range gis {
		if gInfo, ret := gi.GetInfo(); ret == nvml.SUCCESS && int(gInfo.Placement.Start) == start {
			if ret := gi.Destroy(); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			return
		}
	}
	t.Fatalf("GPU %d has no 1-slice GPU instance at %d", gpu, start)
}

func TestMIGCheckWarnsWhereARecordedMIGDeviceIsGone(t *testing.T) {
	m := newMIGNode(t, "dgx-h100", `profiles:
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 4}, gpus: [0]}
`)
	_, ctx := ktesting.NewTestContext(t)
	// The plugin's instance at {6}:1 has its compute instance destroyed
	// and made again (another MIG device); the adopted one at {2}:1 has
	// its compute instance destroyed. The claims' containers were given
	// MIG devices that no longer exist.
	inst := m.pluginInstance(ctx, t, "claim-1", 0, "1g.10gb", 6, false)
	m.foreignInstance(t, 0, 2, true)
	adopted := m.pluginInstance(ctx, t, "claim-2", 0, "1g.10gb", 2, true)
	gone := m.pluginInstance(ctx, t, "claim-3", 0, "1g.10gb", 4, false)
	m.destroyCI(t, 0, 6, true)
	m.destroyCI(t, 0, 2, false)
	// The plugin's instance at {4}:1 is destroyed whole.
	m.destroyCI(t, 0, 4, false)
	m.destroyGI(t, 0, 4)

	gpu0 := check(t, m.run(t), "mig-gpu0")
	if gpu0.Status != Warn {
		t.Errorf("mig-gpu0 is %s, want %s: %+v", gpu0.Status, Warn, gpu0)
	}
	for _, want := range []string{
		"GI 13: 1g.10gb at {6}:1, CI 0 MIG-",
		": the plugin's, claim claim-1 device g0-mig-1g-10gb-6, whose MIG device " + inst.UUID + " is gone",
		"GI 9: 1g.10gb at {2}:1, no compute instance: a static seat (not made by the plugin), adopted by claim claim-2 device g0-mig-1g-10gb-2, whose MIG device " + adopted.UUID + " is gone",
		"journal: Created 1g.10gb at {4}:1, claim claim-3 device g0-mig-1g-10gb-4: no such GPU instance, so its MIG device " + gone.UUID + " is gone",
	} {
		if !hasDetail(gpu0, want) {
			t.Errorf("mig-gpu0 lacks %q: %q", want, gpu0.Details)
		}
	}
}

// A GPU given to a MIG profile that NVML gives no MIG geometry for is
// reported: a warning where it has no MIG (a mixed fleet's GPUs), a
// failure where it has MIG and NVML would not describe its profiles.
func TestMIGCheckGPUsWithoutGeometry(t *testing.T) {
	config := `profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0, 1]}
`
	m := newMIGNode(t, "pcie-8gpu", config)
	r := m.run(t)
	c := check(t, r, "mig-gpu1")
	if c.Status != Warn || c.Summary != "GPU 1 (NVIDIA L40S): MIG profile mig-1g-10gb, but it publishes no MIG device: NVML gives no MIG geometry for it (not MIG-capable: GetMigMode: ERROR_NOT_SUPPORTED)" ||
		!strings.Contains(c.Fix, "leave it out of the profile's gpus") {
		t.Errorf("mig-gpu1: %+v", c)
	}
	if plan := check(t, r, "plan"); !hasDetail(plan, "warning: profile mig-1g-10gb (MIG 1g.10gb): GPU 0, 1 (NVIDIA L40S) publish no MIG device") {
		t.Errorf("plan: %+v", plan)
	}

	topo := filepath.Join(t.TempDir(), "a30.yaml")
	m.write(topo, `gpus:
- {index: 0, productName: NVIDIA A30, architecture: ampere, cudaComputeCapability: "8.0", memoryMiB: 24576}
- {index: 1, productName: NVIDIA A30, architecture: ampere, cudaComputeCapability: "8.0", memoryMiB: 24576}
`)
	m = newMIGNode(t, topo, config)
	r = m.run(t)
	c = check(t, r, "mig-gpu0")
	if c.Status != Fail || !strings.Contains(c.Summary, "GPU 0 (NVIDIA A30): MIG profile mig-1g-10gb, but it publishes no MIG device: NVML gives no MIG geometry for it (no GPU-instance profile:") ||
		!strings.Contains(c.Fix, "nvidia-smi mig -i 0 -lgip and -lgipp ask NVML the same") {
		t.Errorf("mig-gpu0: %+v", c)
	}
	if c := check(t, r, "mig-gpu1"); c.Status != Fail {
		t.Errorf("mig-gpu1: %+v", c)
	}
}

// The doctor runs before the plugin at every start of its pod, after a
// reboot too, and reads the MIG journal before the plugin has forgotten
// the records of the earlier boot. A record of another boot names nothing
// on the GPU now (a reboot takes every MIG instance): the partition an
// administrator made at boot at its placement is not the plugin's, and no
// claim's MIG device is "gone" because of it. The records here are of a
// boot that is neither this node's nor any a test gives the doctor.
func TestMIGCheckIgnoresJournalRecordsOfAnEarlierBoot(t *testing.T) {
	m := newMIGNode(t, "dgx-h100", `profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 4}, gpus: [0]}
`)
	_, ctx := ktesting.NewTestContext(t)
	m.mkdir(driver.PluginDir(m.opts.PluginsDir))
	mgr, err := miginstance.New(miginstance.Options{Dir: driver.PluginDir(m.opts.PluginsDir), NVML: m.host.NVML, Minors: m.host.MIGMinors, BootID: "the-boot-before-the-reboot"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := simnodetest.MIGModel(t, m.device(t, 0)).Profile("1g.10gb")
	if err != nil {
		t.Fatal(err)
	}
	for claim, start := range map[string]int{"claim-1": 6, "claim-2": 5} {
		if _, err := mgr.Ensure(ctx, miginstance.Want{Claim: types.UID(claim), Device: fmt.Sprintf("g0-mig-1g-10gb-%d", start),
			GPU: 0, GPUMinor: 0, GPUUUID: "GPU-x", Architecture: "hopper", Profile: p, Placement: mig.Placement{Start: start, Size: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	// The reboot: every instance goes; the administrator's partition made
	// at boot is a static seat at {6}:1 (GI 13, as the plugin's was).
	if err := m.host.Simulated.ResetGPU(0); err != nil {
		t.Fatal(err)
	}
	m.foreignInstance(t, 0, 6, true)

	gpu0 := check(t, m.run(t), "mig-gpu0")
	if !hasDetail(gpu0, "GI 13: 1g.10gb at {6}:1, CI 0 MIG-") || !hasDetail(gpu0, ": not made by the plugin; a static seat") {
		t.Errorf("the administrator's partition made after the reboot is not reported as a static seat: %+v", gpu0)
	}
	for _, d := range gpu0.Details {
		if strings.Contains(d, "claim-1") || strings.Contains(d, "claim-2") || strings.Contains(d, "is gone") {
			t.Errorf("mig-gpu0 reports a journal record of an earlier boot as this boot's: %q", d)
		}
	}
	if gpu0.Status != OK {
		t.Errorf("mig-gpu0 is %s after a reboot of a node whose plugin made MIG instances (fix %q), want OK", gpu0.Status, gpu0.Fix)
	}
}
