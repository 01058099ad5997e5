//go:build gpucheck

package main

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// gpuSettings are the settings of a GPU that gpu-check must leave as they
// are, as nvidia-smi names them.
type gpuSettings struct {
	index       int
	uuid        string
	computeMode string
	migMode     string
	persistence string
}

// nvmlError is ret as an error, nil for success.
func nvmlError(lib nvml.Interface, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("%s", lib.ErrorString(ret))
}

// readSettings reads every GPU's settings; what NVML cannot tell is
// written as its answer, so that a GPU that stops answering is a change.
func readSettings(lib nvml.Interface, inv *inventory.Inventory) []gpuSettings {
	var out []gpuSettings
	for _, g := range inv.GPUs {
		s := gpuSettings{index: g.Index, uuid: g.UUID}
		dev, ret := lib.DeviceGetHandleByUUID(g.UUID)
		if err := nvmlError(lib, ret); err != nil {
			s.computeMode, s.migMode, s.persistence = "("+err.Error()+")", "-", "-"
			out = append(out, s)
			continue
		}
		if mode, ret := dev.GetComputeMode(); ret == nvml.SUCCESS {
			s.computeMode = inventory.ComputeModeName(mode)
		} else {
			s.computeMode = "(" + lib.ErrorString(ret) + ")"
		}
		switch current, pending, ret := dev.GetMigMode(); {
		case ret == nvml.ERROR_NOT_SUPPORTED:
			s.migMode = "not supported"
		case ret != nvml.SUCCESS:
			s.migMode = "(" + lib.ErrorString(ret) + ")"
		case current == pending:
			s.migMode = enabled(current == nvml.DEVICE_MIG_ENABLE)
		default:
			s.migMode = enabled(current == nvml.DEVICE_MIG_ENABLE) + ", pending " + enabled(pending == nvml.DEVICE_MIG_ENABLE)
		}
		if mode, ret := dev.GetPersistenceMode(); ret == nvml.SUCCESS {
			s.persistence = enabled(mode == nvml.FEATURE_ENABLED)
		} else {
			s.persistence = "(" + lib.ErrorString(ret) + ")"
		}
		out = append(out, s)
	}
	return out
}

func enabled(on bool) string {
	if on {
		return "Enabled"
	}
	return "Disabled"
}

// changedSettings says which settings differ between before and after.
func changedSettings(before, after []gpuSettings) []string {
	var out []string
	if len(before) != len(after) {
		return []string{fmt.Sprintf("%d GPUs before, %d after", len(before), len(after))}
	}
	for i, b := range before {
		a := after[i]
		for _, s := range []struct{ what, was, is string }{
			{"compute mode", b.computeMode, a.computeMode},
			{"MIG mode", b.migMode, a.migMode},
			{"persistence mode", b.persistence, a.persistence},
		} {
			if s.was != s.is {
				out = append(out, fmt.Sprintf("GPU %d (%s): %s %s before, %s after", b.index, b.uuid, s.what, s.was, s.is))
			}
		}
	}
	return out
}
