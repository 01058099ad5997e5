package nvmlconformance

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// run runs the suite over a simulated node, as the plugin opens one, with
// the kernel kernel makes of it (nil: the node's own).
func run(t *testing.T, n *simnode.Node, kernel func(*gpuhost.Host) Kernel) Report {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	h := &gpuhost.Host{NVML: n.NVML(), PCIe: n.PCIe(), Simulated: n}
	var k Kernel = h
	if kernel != nil {
		k = kernel(h)
	}
	r := Run(ctx, Target{NVML: h.NVML, PCIe: h.PCIe, Kernel: k})
	for _, x := range r {
		t.Logf("%s", x)
	}
	return r
}

func load(t *testing.T, spec string) *simnode.Node {
	t.Helper()
	n, err := simnode.Load(spec, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// want is a result expected on a GPU (NodeWide: the node), by status and
// a part of its message.
type want struct {
	check  string
	gpu    int
	status Status
	says   string
}

func checkResults(t *testing.T, r Report, wants []want) {
	t.Helper()
	for _, w := range wants {
		got, ok := r.Find(w.check, w.gpu)
		if !ok {
			t.Errorf("no %s result for GPU %d", w.check, w.gpu)
			continue
		}
		if got.Status != w.status || !strings.Contains(got.Message, w.says) {
			t.Errorf("%s of GPU %d: %s %q; want %s saying %q", w.check, w.gpu, got.Status, got.Message, w.status, w.says)
		}
	}
}

// Every simulated node answers NVML as the plugin relies on a driver
// answering: no check fails on any preset, and each check that does not
// apply says why.
func TestEveryPresetConforms(t *testing.T) {
	tests := map[string]struct {
		pass, skip int
		results    []want
	}{
		"dgx-a100": {pass: 45, skip: 8, results: []want{
			{CheckMIGGeometry, 3, Pass, "MIG mode off; 8 memory slices, 7 compute slices; profiles until index 17: 1g.5gb (ID 19) x7 {0,1,2,3,4,5,6}:1, 1g.5gb+me (ID 20) x1 {0,1,2,3,4,5,6}:1, 1g.10gb (ID 15) x4 {0,2,4,6}:2, 2g.10gb (ID 14) x3 {0,2,4}:2, 3g.20gb (ID 9) x2 {0,4}:4, 4g.20gb (ID 5) x1 {0}:4, 7g.40gb (ID 0) x1 {0}:8"},
			{CheckLinks, NodeWide, Pass, "GPU 0, 1, 2, 3, 4, 5, 6, 7: 12 active NVLinks (0 to GPUs, 12 to NVSwitches)"},
		}},
		"dgx-h100": {pass: 45, skip: 8, results: []want{
			{CheckDeviceNumbers, NodeWide, Pass, "/dev/nvidia-uvm 511:0, /dev/nvidia-uvm-tools 511:1, /dev/nvidia-caps/nvidia-cap1 238:1, /dev/nvidia-caps/nvidia-cap2 238:2"},
			{CheckMIGGeometry, 0, Pass, "1g.10gb (ID 19) x7 {0,1,2,3,4,5,6}:1, 1g.10gb+me (ID 20) x1 {0,1,2,3,4,5,6}:1, 1g.20gb (ID 15) x4 {0,2,4,6}:2"},
			{CheckMIGInstances, 0, Pass, "MIG mode off: GetGpuInstances answers none"},
			{CheckMIGDevices, 0, Skip, "MIG mode off: the GPU has no MIG device"},
		}},
		"dgx-h200": {pass: 45, skip: 8, results: []want{
			{CheckDiscovery, NodeWide, Pass, "8x NVIDIA H200, driver 580.159.04, CUDA 13.0"},
			{CheckIdentity, 7, Pass, "NVIDIA H200, bus 0000:db:00.0, minor 7, 143771 MiB, hopper 9.0, NUMA node: GetNumaNodeId 1"},
			{CheckMIGGeometry, 7, Pass, "1g.18gb (ID 19) x7 {0,1,2,3,4,5,6}:1, 1g.18gb+me (ID 20) x1 {0,1,2,3,4,5,6}:1, 1g.35gb (ID 15) x4 {0,2,4,6}:2, 2g.35gb (ID 14) x3 {0,2,4}:2, 3g.71gb (ID 9) x2 {0,4}:4, 4g.71gb (ID 5) x1 {0}:4, 7g.141gb (ID 0) x1 {0}:8"},
			{CheckDeviceNumbers, NodeWide, Pass, "/dev/nvidia7 195:7, /dev/nvidiactl 195:255, /dev/nvidia-uvm 238:0, /dev/nvidia-uvm-tools 238:1, /dev/nvidia-caps/nvidia-cap1 241:1, /dev/nvidia-caps/nvidia-cap2 241:2"},
			{CheckLinks, NodeWide, Pass, "18 active NVLinks (0 to GPUs, 18 to NVSwitches); pairs: 4 host bridge, 8 NUMA node, 16 system"},
			{CheckEvents, NodeWide, Pass, "0xc00b (SingleBitEccError DoubleBitEccError XidCriticalError GpuUnavailableError GpuRecoveryAction), each registered"},
		}},
		"nvlink-2x4": {pass: 45, skip: 8, results: []want{
			{CheckLinks, NodeWide, Pass, "12 active NVLinks (12 to GPUs, 0 to NVSwitches)"},
		}},
		"pcie-8gpu": {pass: 29, skip: 24, results: []want{
			{CheckMIGGeometry, 5, Skip, "no MIG: GetMigMode answers Not Supported"},
			{CheckMIGInstances, 5, Skip, "no MIG: GetMigMode answers Not Supported"},
			{CheckDeviceNumbers, NodeWide, Pass, "/dev/nvidiactl 195:255, /dev/nvidia-uvm 511:0, /dev/nvidia-uvm-tools 511:1"},
			{CheckLinks, NodeWide, Pass, "no NVLink (link 0 Not Supported); pairs: 4 one PCIe switch, 8 host bridge, 16 system"},
		}},
		"single-gpu": {pass: 8, skip: 3, results: []want{
			{CheckIdentity, 0, Pass, "NVIDIA L4, bus 0000:01:00.0, minor 0, 23034 MiB, ada 8.9"},
			{CheckProcesses, 0, Pass, "GetUtilizationRates 0% SM; 0 running processes; GetProcessUtilization Not Found"},
			{CheckModes, 0, Pass, "compute mode Default, persistence mode Enabled"},
		}},
		"workstation-2gpu": {pass: 11, skip: 6, results: []want{
			{CheckDistinctGPUs, NodeWide, Pass, "2 GPUs, each with its own UUID, bus ID and minor number"},
		}},
	}
	for _, preset := range simnode.Presets() {
		t.Run(preset, func(t *testing.T) {
			tc, ok := tests[preset]
			if !ok {
				t.Fatalf("preset %s has no expectations here: add them", preset)
			}
			r := run(t, load(t, preset), nil)
			if got := r.Failed(); len(got) > 0 {
				t.Errorf("%d checks fail: %v", len(got), got)
			}
			if r.Count(Pass) != tc.pass || r.Count(Skip) != tc.skip {
				t.Errorf("%s; want %d passed, %d skipped", r.Summary(), tc.pass, tc.skip)
			}
			checkResults(t, r, tc.results)
		})
	}
}

// A GPU in MIG mode is read through its instances and MIG devices, as the
// node's survey and the usage sampler read it.
func TestAGPUInMIGModeConforms(t *testing.T) {
	n := load(t, "dgx-h100")
	dev := handle(t, n, 0)
	enableMIG(t, dev)
	makeInstance(t, dev, 2, 4, nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE) // 3g.40gb at {4}:4
	makeInstance(t, dev, 0, 0, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE) // 1g.10gb at {0}:1
	procs := filepath.Join(t.TempDir(), "processes")
	if err := os.WriteFile(procs, []byte("0/2 4242 1024 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.SetProcessesFile(procs)
	r := run(t, n, nil)
	if got := r.Failed(); len(got) > 0 {
		t.Errorf("%d checks fail: %v", len(got), got)
	}
	checkResults(t, r, []want{
		{CheckMIGGeometry, 0, Pass, "MIG mode on; 8 memory slices"},
		{CheckMIGInstances, 0, Pass, "MIG mode on, 2 GPU instances: GI 2 3g.40gb@{4}:4, GI 7 1g.10gb@{0}:1"},
		{CheckMIGDevices, 0, Pass, "7 MIG device slots, 2 devices: MIG-"},
		{CheckMIGDevices, 0, Pass, " 3g.40gb, 1 processes, MIG-"},
		{CheckProcesses, 0, Pass, "MIG mode on: the sampler reads the processes of the MIG devices (mig-devices)"},
		{CheckMIGDevices, 1, Skip, "MIG mode off: the GPU has no MIG device"},
	})
}

func handle(t *testing.T, n *simnode.Node, i int) nvml.Device {
	t.Helper()
	dev, ret := n.NVML().DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU %d: %v", i, ret)
	}
	return dev
}

func enableMIG(t *testing.T, dev nvml.Device) {
	t.Helper()
	if activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); activation != nvml.SUCCESS || ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v, %v", activation, ret)
	}
}

// makeInstance makes a GPU instance of the profile at NVML index index,
// starting at memory slice start, with one compute instance of ciProfile.
func makeInstance(t *testing.T, dev nvml.Device, index, start, ciProfile int) {
	t.Helper()
	info, ret := dev.GetGpuInstanceProfileInfo(index)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetGpuInstanceProfileInfo(%d): %v", index, ret)
	}
	pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS || len(pls) == 0 {
		t.Fatalf("GetGpuInstancePossiblePlacements: %v", ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: pls[0].Size})
	if ret != nvml.SUCCESS {
		t.Fatalf("CreateGpuInstanceWithPlacement: %v", ret)
	}
	ci, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeInstanceProfileInfo: %v", ret)
	}
	if _, ret := gi.CreateComputeInstance(&ci); ret != nvml.SUCCESS {
		t.Fatalf("CreateComputeInstance: %v", ret)
	}
}

// failures are a report's failed checks, as check/GPU: message.
func failures(r Report) []string {
	var out []string
	for _, f := range r.Failed() {
		out = append(out, f.String())
	}
	return out
}

// The suite fails a simulated node that drifts from what a driver
// answers: each case changes one thing about the node and names the
// checks that must fail, with what their failure must say. The same
// checks fail on a real GPU whose driver answers so.
func TestTheSuiteCatchesADriftingNode(t *testing.T) {
	tests := []struct {
		name string
		// node makes the drifted node; kernel, if set, its kernel.
		node   func(t *testing.T) *simnode.Node
		kernel func(h *gpuhost.Host) Kernel
		// fails are the failed checks, "check GPU": each with what its
		// message must hold.
		fails map[string][]string
	}{{
		name: "placements that disagree with their profile",
		node: func(t *testing.T) *simnode.Node {
			return load(t, topology(t, `
- {index: 0, id: 19, sliceCount: 1, instanceCount: 7, multiprocessorCount: 16, memorySizeMB: 9984, placements: {starts: [0, 2, 4, 6], size: 2}}
- {index: 4, id: 0, sliceCount: 7, instanceCount: 1, multiprocessorCount: 132, memorySizeMB: 81152, placements: {starts: [0], size: 8}}`))
		},
		fails: map[string][]string{"mig-geometry 0": {
			"profile index 0 (ID 19): 9984 MiB is 1 of the GPU's 8 memory slices, but its placements are {0,2,4,6}:2",
			"profile index 0 (ID 19): 7 instances, but only 4 fit on its placements {0,2,4,6}:2 at once",
		}},
	}, {
		name: "placements answered for a profile other than the info's",
		node: func(t *testing.T) *simnode.Node {
			n := load(t, "dgx-h200")
			d := mockDevice(t, n, 3)
			real := d.GetGpuInstancePossiblePlacementsFunc
			d.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
				whole, _ := d.GetGpuInstanceProfileInfo(4)
				return real(&whole)
			}
			return n
		},
		fails: map[string][]string{"mig-geometry 3": {
			"profile index 0 (ID 19): 16384 MiB is 1 of the GPU's 8 memory slices, but its placements are {0}:8",
			"profile index 0 (ID 19): 7 instances, but only 1 fit on its placements {0}:8 at once",
			"profile index 9 (ID 15): 33280 MiB is 2 of the GPU's 8 memory slices, but its placements are {0}:8",
		}},
	}, {
		name: "a profile walk that never ends",
		node: func(t *testing.T) *simnode.Node {
			n := load(t, "dgx-a100")
			mockDevice(t, n, 0).GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return n
		},
		fails: map[string][]string{"mig-geometry 0": {"GetGpuInstanceProfileInfo answers no ERROR_INVALID_ARGUMENT below index 256"}},
	}, {
		name: "two GPUs with one UUID",
		node: func(t *testing.T) *simnode.Node {
			n := load(t, "workstation-2gpu")
			first, _ := handle(t, n, 0).GetUUID()
			mockDevice(t, n, 1).GetUUIDFunc = func() (string, nvml.Return) { return first, nvml.SUCCESS }
			return n
		},
		fails: map[string][]string{
			"identity 1":         {"the handle of UUID GPU-5db000f2-2382-c0dd-2bf5-81136c937bd1 answers index 0 (Success), not 1"},
			"distinct-gpus node": {"GPUs 0 and 1 have UUID GPU-5db000f2-2382-c0dd-2bf5-81136c937bd1"},
		},
	}, {
		name: "device numbers that are not those /proc/devices lists",
		node: func(t *testing.T) *simnode.Node { return load(t, "dgx-h200") },
		// The majors of a host whose modules loaded in another order: the
		// simulated node's device numbers are not this kernel's.
		kernel: func(h *gpuhost.Host) Kernel {
			return procDevices{h, "Character devices:\n195 nvidia-frontend\n239 nvidia-caps\n240 nvidia-uvm\n"}
		},
		fails: map[string][]string{"device-numbers node": {
			"/dev/nvidia-uvm: the plugin gives it 238:0, /proc/devices makes it 240:0",
			"/dev/nvidia-uvm-tools: the plugin gives it 238:1, /proc/devices makes it 240:1",
			"/dev/nvidia-caps/nvidia-cap1: the plugin gives it 241:1, /proc/devices makes it 239:1",
			"/dev/nvidia-caps/nvidia-cap2: the plugin gives it 241:2, /proc/devices makes it 239:2",
		}},
	}, {
		name: "an NVLink query failing as discovery does not expect",
		node: func(t *testing.T) *simnode.Node {
			n := load(t, "nvlink-2x4")
			mockDevice(t, n, 2).GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			return n
		},
		fails: map[string][]string{
			"discovery node": {"the plugin's discovery fails: GPU 2: read NVLink 0 state: NVML: Unknown Error (999)"},
			"links node":     {"GPU 2: GetNvLinkState(0): Unknown Error, which fails discovery"},
		},
	}, {
		name: "a GPU that refuses events it says it supports",
		node: func(t *testing.T) *simnode.Node {
			n := load(t, "pcie-8gpu")
			mockDevice(t, n, 6).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
			return n
		},
		fails: map[string][]string{"events node": {"GPU 6: RegisterEvents refuses supported events: SingleBitEccError (Not Supported), DoubleBitEccError (Not Supported), XidCriticalError (Not Supported), GpuUnavailableError (Not Supported)"}},
	}, {
		name: "a process using more memory than its GPU has",
		node: func(t *testing.T) *simnode.Node {
			n := load(t, "single-gpu")
			procs := filepath.Join(t.TempDir(), "processes")
			if err := os.WriteFile(procs, []byte("0 4242 30000 10\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			n.SetProcessesFile(procs)
			return n
		},
		fails: map[string][]string{"processes 0": {"GetComputeRunningProcesses: PID 4242 uses 31457280000 bytes of 24152899584"}},
	}, {
		name: "a MIG device named for another profile",
		node: func(t *testing.T) *simnode.Node {
			n := load(t, "dgx-h100")
			dev := handle(t, n, 5)
			enableMIG(t, dev)
			makeInstance(t, dev, 3, 0, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE) // 4g.40gb
			md, ret := dev.GetMigDeviceHandleByIndex(0)
			if ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			asMock(t, md).GetNameFunc = func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3 MIG 4g.20gb", nvml.SUCCESS }
			return n
		},
		fails: map[string][]string{"mig-devices 5": {`named "NVIDIA H100 80GB HBM3 MIG 4g.20gb", which does not end in MIG 4g.40gb, the name the plugin derives for its profile`}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tc.node(t), tc.kernel)
			var got []string
			for _, f := range r.Failed() {
				on := "node"
				if f.GPU != NodeWide {
					on = strconv.Itoa(f.GPU)
				}
				key := f.Check + " " + on
				got = append(got, key)
				for _, says := range tc.fails[key] {
					if !strings.Contains(f.Message, says) {
						t.Errorf("%s: %q does not say %q", key, f.Message, says)
					}
				}
			}
			var wantKeys []string
			for k := range tc.fails {
				wantKeys = append(wantKeys, k)
			}
			slices.Sort(got)
			slices.Sort(wantKeys)
			if !slices.Equal(got, wantKeys) {
				t.Errorf("failed checks %q, want %q:\n%s", got, wantKeys, strings.Join(failures(r), "\n"))
			}
		})
	}
}

// topology is a NodeTopology file of one H100 80GB HBM3 whose MIG
// geometry is profiles (YAML list items).
func topology(t *testing.T, profiles string) string {
	t.Helper()
	doc := `apiVersion: kyb.ai/v1alpha1
kind: NodeTopology
driverVersion: "580.95.05"
cudaDriverVersion: "13.0"
gpus:
- index: 0
  pciBusID: "0000:18:00.0"
  productName: NVIDIA H100 80GB HBM3
  architecture: hopper
  cudaComputeCapability: "9.0"
  memoryMiB: 81559
  mig:
    profiles:` + strings.ReplaceAll(profiles, "\n", "\n    ") + "\n"
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// mockDevice is GPU i of a simulated node as the go-nvml mock it is
// built on, for a test to change one of its answers.
func mockDevice(t *testing.T, n *simnode.Node, i int) *mock.Device {
	t.Helper()
	return asMock(t, handle(t, n, i))
}

func asMock(t *testing.T, dev nvml.Device) *mock.Device {
	t.Helper()
	d, ok := dev.(*mock.Device)
	if !ok {
		t.Fatalf("the simulated device is a %T, not a go-nvml mock device", dev)
	}
	return d
}

// procDevices is a kernel whose /proc/devices is text.
type procDevices struct {
	Kernel
	text string
}

func (p procDevices) ReadProcFile(name string) ([]byte, error) {
	if name == gpuhost.ProcDevices {
		return []byte(p.text), nil
	}
	return p.Kernel.ReadProcFile(name)
}
