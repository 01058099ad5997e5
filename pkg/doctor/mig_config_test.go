package doctor

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

const cap1 = "/dev/nvidia-caps/nvidia-cap1"

// newH200MajorsNode is a dgx-h100 whose kernel gave nvidia-uvm and
// nvidia-caps the majors an H200 node listed (238, 241), with GPU 0 given
// to a MIG profile where mig.
func newH200MajorsNode(t *testing.T, mig bool) *migNode {
	t.Helper()
	src, err := simnode.PresetSource("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t)
	topology := n.write(filepath.Join(n.root, "h200-majors.yaml"), string(src)+"uvmMajor: 238\ncapsMajor: 241\n")
	config := "profiles:\n- {resource: kyb.ai/gpu-1x-seat}\n"
	if mig {
		config += "- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}\n"
	}
	return newMIGNode(t, topology, config)
}

func TestMIGConfigCapability(t *testing.T) {
	tests := []struct {
		name string
		// change makes the node's capability node or the process what
		// the case is about.
		change      func(*simnode.Node)
		wantStatus  Status
		wantSummary string
		wantFix     []string
	}{
		{
			name:        "root opens the node of the majors /proc/devices lists",
			change:      func(*simnode.Node) {},
			wantStatus:  OK,
			wantSummary: "the MIG config capability: /dev/nvidia-caps/nvidia-cap1 (241:1) opens for reading; NVML may make and destroy MIG instances",
		},
		{
			name:        "missing",
			change:      func(n *simnode.Node) { n.SetDevice(cap1, nil) },
			wantStatus:  Fail,
			wantSummary: "the MIG config capability: /dev/nvidia-caps/nvidia-cap1 is missing",
			wantFix:     []string{"nvidia-modprobe -f /proc/driver/nvidia/capabilities/mig/config", "mknod -m 400 /dev/nvidia-caps/nvidia-cap1 c 241 1", "every prepare of a MIG seat fails"},
		},
		{
			name: "made by hand with an earlier boot's major",
			change: func(n *simnode.Node) {
				n.SetDevice(cap1, &simnode.DeviceFile{Major: 238, Minor: 1, Mode: fs.ModeDevice | fs.ModeCharDevice | 0o400})
			},
			wantStatus:  Fail,
			wantSummary: "the MIG config capability: /dev/nvidia-caps/nvidia-cap1 is 238:1, want 241:1",
			wantFix:     []string{"rm /dev/nvidia-caps/nvidia-cap1 && mknod -m 400 /dev/nvidia-caps/nvidia-cap1 c 241 1"},
		},
		{
			name:        "a plain file at the node's path",
			change:      func(n *simnode.Node) { n.SetDevice(cap1, &simnode.DeviceFile{Mode: 0o644}) },
			wantStatus:  Fail,
			wantSummary: "the MIG config capability: /dev/nvidia-caps/nvidia-cap1 is not a character device (mode -rw-r--r--)",
			wantFix:     []string{"mknod -m 400 /dev/nvidia-caps/nvidia-cap1 c 241 1"},
		},
		{
			name:        "the plugin is not root",
			change:      func(n *simnode.Node) { n.SetProcessUID(1000) },
			wantStatus:  Fail,
			wantSummary: "the MIG config capability: /dev/nvidia-caps/nvidia-cap1 is not readable by this process's user (mode 0400, owner uid 0)",
			wantFix:     []string{"run the plugin as root"},
		},
		{
			name:        "a container that is not privileged",
			change:      func(n *simnode.Node) { n.DenyDevice(cap1) },
			wantStatus:  Fail,
			wantSummary: "the MIG config capability: the device cgroup refuses /dev/nvidia-caps/nvidia-cap1 to this container",
			wantFix:     []string{"run the plugin's container privileged"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newH200MajorsNode(t, true)
			tt.change(m.host.Simulated)
			r := m.run(t)
			c := check(t, r, "mig-config")
			if c.Status != tt.wantStatus || c.Summary != tt.wantSummary {
				t.Errorf("mig-config: %s %q; want %s %q", c.Status, c.Summary, tt.wantStatus, tt.wantSummary)
			}
			for _, want := range tt.wantFix {
				if !strings.Contains(c.Fix, want) {
					t.Errorf("fix %q lacks %q", c.Fix, want)
				}
			}
			if r.Failed() != (tt.wantStatus == Fail) {
				t.Errorf("report failed: %v, want %v", r.Failed(), tt.wantStatus == Fail)
			}
			// It opens the node as NVML would, and makes nothing.
			for _, call := range []simnode.Call{simnode.CallSetMigMode, simnode.CallCreateGpuInstance, simnode.CallCreateGpuInstanceWithPlacement, simnode.CallCreateComputeInstance} {
				if n := m.host.Simulated.CallCount(call); n != 0 {
					t.Errorf("the doctor called %s %d times", call, n)
				}
			}
		})
	}
}

// Only a node with a MIG profile needs the capability.
func TestMIGConfigCapabilityOnlyWithAMIGProfile(t *testing.T) {
	m := newH200MajorsNode(t, false)
	m.host.Simulated.SetDevice(cap1, nil)
	r := m.run(t)
	for _, c := range r.Checks {
		if c.Name == "mig-config" {
			t.Errorf("a node without MIG profiles has a mig-config check: %+v", c)
		}
	}
}

// NVML gives a GPU's MIG placements only to a privileged process: a
// plugin that is neither root nor holds a MIG capability reads no MIG
// geometry, and the doctor says to run it as root.
func TestMIGCheckOfAnUnprivilegedPlugin(t *testing.T) {
	m := newH200MajorsNode(t, true)
	m.host.Simulated.SetProcessUID(1000)
	m.host.Simulated.DenyDevice(cap1)
	m.host.Simulated.DenyDevice("/dev/nvidia-caps/nvidia-cap2")
	c := check(t, m.run(t), "mig-gpu0")
	if c.Status != Fail || !strings.Contains(c.Summary, "NVML gives no MIG geometry for it (GetGpuInstancePossiblePlacements(profile ID 19): ERROR_NO_PERMISSION)") ||
		!strings.Contains(c.Fix, "run the plugin as root") {
		t.Errorf("mig-gpu0: %+v", c)
	}
}
