package simnode

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestMIGStateCarriedToANewNode: a node restored from another's MIG state
// has the same instances under the same UUIDs and the same capability
// minors, and the next instance it makes gets a UUID neither made.
func TestMIGStateCarriedToANewNode(t *testing.T) {
	n, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	gi, ret := createGI(t, d, m, "1g.10gb", 6)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ci, ret := fullCI(t, gi)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := createGI(t, d, m, "2g.20gb", 2); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := ci.GetInfo(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	migDev, ret := d.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	uuid, _ := migDev.GetUUID()

	raw, err := json.Marshal(n.MIGState())
	if err != nil {
		t.Fatal(err)
	}
	var s MIGState
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	next, d2, _ := gpu0(t, "dgx-h100")
	if err := next.RestoreMIG(s); err != nil {
		t.Fatal(err)
	}
	if got, want := layout(next, 0), "mode 1/1; GI 4 2g.20gb@{2}:2; GI 13 1g.10gb@{6}:1 CI 0 1c@0"; got != want {
		t.Errorf("restored layout %q, want %q", got, want)
	}
	if got, want := layout(next, 0), layout(n, 0); got != want {
		t.Errorf("restored layout %q, the first node's %q", got, want)
	}
	restored, ret := d2.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if got, _ := restored.GetUUID(); got != uuid {
		t.Errorf("restored MIG device UUID %s, want %s", got, uuid)
	}
	oldNodes, err := n.MIGDeviceNodes(uuid)
	if err != nil {
		t.Fatal(err)
	}
	newNodes, err := next.MIGDeviceNodes(uuid)
	if err != nil || len(newNodes) != len(oldNodes) || newNodes[0] != oldNodes[0] || newNodes[len(newNodes)-1] != oldNodes[len(oldNodes)-1] {
		t.Errorf("restored device nodes %v (%v), want %v", newNodes, err, oldNodes)
	}
	// The restored GPU instance is destroyed as a made one is.
	gis, ret := d2.GetGpuInstanceById(13)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gis.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("Destroy of a restored GPU instance with its compute instance = %v, want ERROR_IN_USE", ret)
	}
	rci, _ := gis.GetComputeInstanceById(0)
	if ret := rci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := fullCI(t, gis); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	remade, _ := d2.GetMigDeviceHandleByIndex(0)
	if got, _ := remade.GetUUID(); got == uuid || !strings.HasPrefix(got, "MIG-") {
		t.Errorf("a compute instance made after the restore has UUID %s, want a new MIG- UUID (not %s)", got, uuid)
	}
}

func TestMIGStateRestoreRefusesWhatNoGPUCouldBe(t *testing.T) {
	for name, s := range map[string]MIGState{
		"unknown GPU":       {GPUs: []MIGGPUState{{Index: 99, Current: 1, Pending: 1}}},
		"instances MIG off": {GPUs: []MIGGPUState{{Index: 0, Instances: []GPUInstanceState{{ProfileID: 19, Start: 0, Size: 1}}}}},
		"bad placement":     {GPUs: []MIGGPUState{{Index: 0, Current: 1, Pending: 1, Instances: []GPUInstanceState{{ProfileID: 14, Start: 1, Size: 2}}}}},
		"overlap": {GPUs: []MIGGPUState{{Index: 0, Current: 1, Pending: 1, Instances: []GPUInstanceState{
			{ProfileID: 14, Start: 0, Size: 2}, {ProfileID: 19, Start: 1, Size: 1}}}}},
		"compute instance too big": {GPUs: []MIGGPUState{{Index: 0, Current: 1, Pending: 1, Instances: []GPUInstanceState{
			{ProfileID: 19, Start: 0, Size: 1, ComputeInstances: []ComputeInstanceState{{ID: 0, Profile: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE}}}}}}},
	} {
		t.Run(name, func(t *testing.T) {
			n, _, _ := gpu0(t, "dgx-h100")
			if err := n.RestoreMIG(s); err == nil {
				t.Fatalf("RestoreMIG(%+v) = nil, want an error", s)
			}
			if got := layout(n, 0); got != "mode 0/0" {
				t.Errorf("after a refused restore: %q, want MIG off and no instances", got)
			}
		})
	}
}
