package simnode

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestGPUModesAnswerAsNVMLDoes(t *testing.T) {
	tests := []struct {
		preset  string
		migRet  nvml.Return
		migMode int
	}{
		{"dgx-h100", nvml.SUCCESS, nvml.DEVICE_MIG_DISABLE},
		{"single-gpu", nvml.ERROR_NOT_SUPPORTED, 0},
	}
	for _, tc := range tests {
		t.Run(tc.preset, func(t *testing.T) {
			n, err := Load(tc.preset, "node-1")
			if err != nil {
				t.Fatal(err)
			}
			dev, ret := n.NVML().DeviceGetHandleByIndex(0)
			if ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			current, pending, ret := dev.GetMigMode()
			if ret != tc.migRet || current != tc.migMode || pending != tc.migMode {
				t.Errorf("MIG mode %d, pending %d (%v), want %d (%v)", current, pending, ret, tc.migMode, tc.migRet)
			}
			if mode, ret := dev.GetPersistenceMode(); ret != nvml.SUCCESS || mode != nvml.FEATURE_ENABLED {
				t.Errorf("persistence mode %v (%v), want enabled", mode, ret)
			}
		})
	}
}
