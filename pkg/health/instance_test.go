package health

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// makeInstance makes a MIG instance of profile at start on GPU gpu of the
// rig's simulated node (MIG mode on first), with the compute instance
// that takes it whole, as the plugin makes them, and returns its GPU
// instance ID.
func (r *rig) makeInstance(gpu int, profile string, start int) uint32 {
	r.t.Helper()
	d, ret := r.sim.NVML().DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		r.t.Fatal(ret)
	}
	if current, _, _ := d.GetMigMode(); current != nvml.DEVICE_MIG_ENABLE {
		if activation, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); activation != nvml.SUCCESS || ret != nvml.SUCCESS {
			r.t.Fatalf("GPU %d: enable MIG: %v, %v", gpu, activation, ret)
		}
	}
	p, err := simnodetest.MIGModel(r.t, d).Profile(profile)
	if err != nil {
		r.t.Fatal(err)
	}
	info, ret := d.GetGpuInstanceProfileInfo(p.Index)
	if ret != nvml.SUCCESS {
		r.t.Fatalf("GPU %d: profile %s: %v", gpu, profile, ret)
	}
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.MemorySlices)})
	if ret != nvml.SUCCESS {
		r.t.Fatalf("GPU %d: make %s at %d: %v", gpu, profile, start, ret)
	}
	whole := map[int]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
		4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[p.ComputeSlices]
	ci, ret := gi.GetComputeInstanceProfileInfo(whole, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		r.t.Fatalf("GPU %d: compute profile of %s: %v", gpu, profile, ret)
	}
	if _, ret := gi.CreateComputeInstance(&ci); ret != nvml.SUCCESS {
		r.t.Fatalf("GPU %d: make the compute instance of %s: %v", gpu, profile, ret)
	}
	gii, _ := gi.GetInfo()
	return gii.Id
}

// instanceFaults renders the unhealthy MIG instances as
// "gpu/placement:reason" in order.
func (r *rig) instanceFaults() string {
	var out []string
	for in, f := range r.m.InstanceFaults() {
		out = append(out, fmt.Sprintf("%d/%s:%s", in.GPU, in.Placement, f.Reason))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func TestMIGInstanceFaults(t *testing.T) {
	type step struct {
		at        time.Duration
		do        string
		gpus      string // the unhealthy GPUs after the step
		instances string // the unhealthy MIG instances after the step
	}
	// GPU 2 of the simulated DGX H100 holds 1g.10gb instances at slices
	// 0 and 3 (GPU instance IDs 7 and 10) and a 3g.40gb at 4 (ID 2).
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "an XID of one instance makes that instance unhealthy, not its GPU, and it recovers",
			steps: []step{
				{0, "xid 2 79 10", "", "2/{3}:1:xid-79"},
				{4*time.Minute + 59*time.Second, "probe", "", "2/{3}:1:xid-79"},
				{5 * time.Minute, "probe", "", ""},
			},
		},
		{
			name: "an XID of the compute instance counts for its GPU instance",
			steps: []step{
				{0, "xid 2 48 2 0", "", "2/{4}:4:xid-48"},
			},
		},
		{
			name: "a double-bit ECC error of one instance",
			steps: []step{
				{0, "ecc 2 7", "", "2/{0}:1:double-bit-ecc"},
			},
		},
		{
			name: "an XID of the whole MIG GPU makes the GPU unhealthy",
			steps: []step{
				{0, "xid 2 79", "2:xid-79", ""},
			},
		},
		{
			name: "instances recover apart, each a period after its last fault",
			steps: []step{
				{0, "xid 2 79 10", "", "2/{3}:1:xid-79"},
				{2 * time.Minute, "xid 2 74 7", "", "2/{0}:1:xid-74 2/{3}:1:xid-79"},
				{4 * time.Minute, "xid 2 48 10", "", "2/{0}:1:xid-74 2/{3}:1:xid-79"},
				{7 * time.Minute, "probe", "", "2/{3}:1:xid-79"},
				{9 * time.Minute, "probe", "", ""},
			},
		},
		{
			name: "an instance waits for its GPU's probes to answer",
			steps: []step{
				{0, "xid 2 79 10", "", "2/{3}:1:xid-79"},
				{4 * time.Minute, "fail 2", "", "2/{3}:1:xid-79"},
				{5 * time.Minute, "probe", "2:unreachable", "2/{3}:1:xid-79"},
				{5*time.Minute + time.Second, "recover 2", "2:unreachable", "2/{3}:1:xid-79"},
				{10*time.Minute + time.Second, "probe", "", ""},
			},
		},
		{
			name: "an instance XID the policy ignores changes nothing",
			steps: []step{
				{0, "xid 2 31 10", "", ""},
			},
		},
		{
			name: "an event of an instance NVML cannot find counts for the whole GPU",
			steps: []step{
				{0, "xid 2 79 12", "2:xid-79", ""},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, nil)
			for _, at := range []struct {
				profile string
				start   int
				id      uint32
			}{{"1g.10gb", 0, 7}, {"1g.10gb", 3, 10}, {"3g.40gb", 4, 2}} {
				if id := r.makeInstance(2, at.profile, at.start); id != at.id {
					t.Fatalf("%s at %d has GPU instance ID %d, want %d", at.profile, at.start, id, at.id)
				}
			}
			for _, s := range tt.steps {
				r.do(s.at, s.do)
				if got := r.faults(); got != s.gpus {
					t.Fatalf("after %q at +%v: unhealthy GPUs %q, want %q", s.do, s.at, got, s.gpus)
				}
				if got := r.instanceFaults(); got != s.instances {
					t.Fatalf("after %q at +%v: unhealthy instances %q, want %q", s.do, s.at, got, s.instances)
				}
			}
		})
	}
}

func TestMIGInstanceFaultMessagesNameTheInstance(t *testing.T) {
	r := newRig(t, nil)
	id := r.makeInstance(2, "1g.10gb", 3)
	r.do(0, fmt.Sprintf("xid 2 79 %d", id))
	r.do(0, "xid 2 74 12")
	in := Instance{GPU: 2, Placement: mig.Placement{Start: 3, Size: 1}}
	for _, c := range []struct {
		in   Instance
		want string
	}{
		{in, "GPU 2: XID 74 (NVLink error) (GPU instance 12, not found); GPU 2 MIG instance at {3}:1: XID 79 (GPU has fallen off the bus) (GPU instance 10)"},
		{Instance{GPU: 2, Placement: mig.Placement{Start: 0, Size: 1}}, "GPU 2: XID 74 (NVLink error) (GPU instance 12, not found)"},
		{Instance{GPU: 3, Placement: mig.Placement{Start: 3, Size: 1}}, ""},
	} {
		ok, msg := OfInstance(c.in, r.m.Faults(), r.m.InstanceFaults())
		if ok != (c.want == "") || msg != c.want {
			t.Errorf("%s: %v %q, want %q", c.in, ok, msg, c.want)
		}
	}
}

func TestMIGInstanceEventsAreCountedOnTheirGPU(t *testing.T) {
	r := newRig(t, nil)
	id := r.makeInstance(2, "1g.10gb", 3)
	r.do(0, fmt.Sprintf("xid 2 79 %d", id))
	r.do(0, fmt.Sprintf("xid 2 13 %d", id))
	r.do(5*time.Minute, "probe")
	for _, c := range []struct {
		kind string
		want float64
	}{{"xid", 1}, {"xid_ignored", 1}, {"recovered", 1}} {
		if got := testutil.ToFloat64(r.m.metrics.events.WithLabelValues("2", c.kind)); got != c.want {
			t.Errorf("gpu 2 kind %s: %v, want %v", c.kind, got, c.want)
		}
	}
}

// An event handed out on a MIG device's own handle, rather than its GPU's,
// is that MIG device's instance's.
func TestMIGEventOnAMIGDeviceHandleIsItsInstances(t *testing.T) {
	r := newRig(t, nil)
	r.makeInstance(2, "1g.10gb", 3)
	gpu, ret := r.sim.NVML().DeviceGetHandleByIndex(2)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	md, ret := gpu.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	r.m.handleEvent(r.ctx, nvml.EventData{Device: md, EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: noInstance, ComputeInstanceId: noInstance})
	if got, want := r.faults(), ""; got != want {
		t.Errorf("unhealthy GPUs %q, want %q", got, want)
	}
	if got, want := r.instanceFaults(), "2/{3}:1:xid-79"; got != want {
		t.Errorf("unhealthy instances %q, want %q", got, want)
	}
}

// A memory fault of an instance reaches the MIG devices of every
// placement that shares one of its memory slices, and every group holding
// its GPU whole; any other fault only the devices at its own placement.
func TestMIGInstanceMemoryFaultReachesOverlappingPlacements(t *testing.T) {
	pl := func(start, size int) Instance {
		return Instance{GPU: 2, Placement: mig.Placement{Start: start, Size: size}}
	}
	tests := []struct {
		name  string
		event string // %d: the GPU instance ID of the 1g.10gb at slice 4
		// unhealthy are the placements of GPU 2 whose devices the fault
		// reaches, among {4}:1, {5}:1, {4}:2, {4}:4, {0}:8, {2}:2, {3}:1.
		unhealthy []Instance
		// groups: the groups of whole GPUs 2 and 2-3 are unhealthy.
		groups bool
	}{
		{"double-bit ECC event", "ecc 2 %d", []Instance{pl(4, 1), pl(4, 2), pl(4, 4), pl(0, 8)}, true},
		{"XID 48, double-bit ECC", "xid 2 48 %d", []Instance{pl(4, 1), pl(4, 2), pl(4, 4), pl(0, 8)}, true},
		{"XID 95, uncontained ECC", "xid 2 95 %d", []Instance{pl(4, 1), pl(4, 2), pl(4, 4), pl(0, 8)}, true},
		{"XID 64, row remapping failed", "xid 2 64 %d", []Instance{pl(4, 1), pl(4, 2), pl(4, 4), pl(0, 8)}, true},
		{"XID 79 is the instance's own", "xid 2 79 %d", []Instance{pl(4, 1)}, false},
		{"XID 119 is the instance's own", "xid 2 119 %d", []Instance{pl(4, 1)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, nil)
			id := r.makeInstance(2, "1g.10gb", 4)
			r.do(0, fmt.Sprintf(tt.event, id))
			for _, at := range []Instance{pl(4, 1), pl(5, 1), pl(4, 2), pl(4, 4), pl(0, 8), pl(2, 2), pl(3, 1)} {
				ok, msg := OfInstance(at, r.m.Faults(), r.m.InstanceFaults())
				if want := slices.Contains(tt.unhealthy, at); ok == want {
					t.Errorf("devices at %s: healthy %v (%q), want %v", at.Placement, ok, msg, !want)
				} else if want && !strings.HasPrefix(msg, "GPU 2 MIG instance at {4}:1: ") {
					t.Errorf("devices at %s: %q, want the message of the instance at {4}:1", at.Placement, msg)
				}
			}
			if ok, _ := OfInstance(Instance{GPU: 3, Placement: mig.Placement{Start: 4, Size: 1}}, r.m.Faults(), r.m.InstanceFaults()); !ok {
				t.Error("another GPU's instance at {4}:1 is unhealthy")
			}
			for _, g := range [][]int{{2}, {2, 3}} {
				ok, msg := OfGroup(g, r.m.Faults(), r.m.InstanceFaults())
				if ok == tt.groups {
					t.Errorf("group of GPUs %v: healthy %v (%q), want %v", g, ok, msg, !tt.groups)
				} else if tt.groups && !strings.HasPrefix(msg, "GPU 2 MIG instance at {4}:1: ") {
					t.Errorf("group of GPUs %v: %q, want the message of the instance at {4}:1", g, msg)
				}
			}
			if ok, msg := OfGroup([]int{3}, r.m.Faults(), r.m.InstanceFaults()); !ok {
				t.Errorf("the group of GPU 3: unhealthy (%q)", msg)
			}
		})
	}
}

// Devices reached by several faults name their own placement's first.
func TestMIGReachingPutsTheInstanceItselfFirst(t *testing.T) {
	r := newRig(t, nil)
	one := r.makeInstance(2, "1g.10gb", 4)
	r.do(0, fmt.Sprintf("ecc 2 %d", one))
	// The 1g at 4 is gone; a 2g made at 4 fails too.
	d, _ := r.sim.NVML().DeviceGetHandleByIndex(2)
	gi, ret := d.GetGpuInstanceById(int(one))
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	cis, ret := gi.GetComputeInstances(&ciInfo)
	if ret != nvml.SUCCESS || len(cis) != 1 {
		t.Fatalf("compute instances of the 1g at 4: %d, %v", len(cis), ret)
	}
	for _, ci := range cis {
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	two := r.makeInstance(2, "2g.20gb", 4)
	r.do(0, fmt.Sprintf("xid 2 79 %d", two))
	at := Instance{GPU: 2, Placement: mig.Placement{Start: 4, Size: 2}}
	got := Reaching(at, r.m.InstanceFaults())
	want := []Instance{at, {GPU: 2, Placement: mig.Placement{Start: 4, Size: 1}}}
	if !slices.Equal(got, want) {
		t.Errorf("Reaching(%s) = %v, want %v", at, got, want)
	}
}
