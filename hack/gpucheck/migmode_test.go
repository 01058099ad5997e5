//go:build gpucheck

package main

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// A configuration that gives GPU 0 both to a MIG profile and to the
// one-GPU groups gpu-check prepares a whole-GPU claim of (step 4): the
// plugin readies a whole-GPU group on a GPU its MIG seats share by
// turning MIG mode off (miginstance.Manager.WholeGPU), at once on a Hopper
// GPU. On an H200 whose MIG mode is on, step 4 would change it, which
// gpu-check promises never to do: the plan must be refused before
// anything runs, as one that would change a compute mode is.
func TestRefusesAPlanWhoseWholeGPUClaimTurnsMIGModeOff(t *testing.T) {
	n := simnodetest.New(t, "dgx-h200", `profiles:
- {resource: kyb.ai/gpu-1x-seat, gpus: [0]}
- {resource: kyb.ai/mig-1g.18gb, mig: {profile: 1g.18gb}, gpus: [0]}
`)
	dev, ret := n.Sim.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); activation != nvml.SUCCESS || ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v, %v", activation, ret)
	}
	whole, err := firstOneGPUGroup(n.Plan)
	if err != nil {
		t.Fatal(err)
	}
	if whole.GPUs[0] != 0 {
		t.Fatalf("step 4 would prepare group %s, on GPU %v; the case needs GPU 0", whole.DeviceName(), whole.GPUs)
	}
	if err := changesNoSetting(n.Plan); err == nil {
		t.Error("gpu-check accepts a plan whose whole-GPU claim (step 4) turns MIG mode off on GPU 0, which a MIG profile shares and whose MIG mode is on")
	}
}
