package miginstance

// A GPU can be given both to MIG profiles and to whole-GPU groups (the
// counters keep an instance and a group off it at the same time), and a
// GPU whose MIG seats turned MIG mode on stays in it once they are
// released: a container given a GPU in MIG mode whole sees no CUDA
// device. So the prepare of a whole-GPU group on such a GPU turns MIG mode
// off where that takes effect at once and no instance is left, and fails
// otherwise, saying why, rather than hand out a GPU nothing can use.

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// WholeGPU readies a GPU to be handed out whole: MIG mode off. arch is
// its architecture ("hopper", ...). It runs under the journal's lock, so
// that no instance is made on the GPU meanwhile.
func (m *Manager) WholeGPU(ctx context.Context, gpu int, arch string) error {
	_, unlock, err := m.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	g, err := m.gpu(gpu)
	if err != nil {
		return err
	}
	dev := g.dev
	current, _, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return nil // no MIG on this GPU
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: read its MIG mode: %w", gpu, callErr("GetMigMode", ret))
	}
	if current != nvml.DEVICE_MIG_ENABLE {
		return nil
	}
	gis, err := gpuInstances(dev)
	if err != nil {
		return fmt.Errorf("GPU %d: list its MIG instances: %w", gpu, err)
	}
	var placed []mig.Placement
	for _, g := range gis {
		placed = append(placed, mig.Placement{Start: int(g.info.Placement.Start), Size: int(g.info.Placement.Size)})
	}
	if len(placed) > 0 {
		return fmt.Errorf("GPU %d is in MIG mode and holds MIG instances at %v, so a container given it whole would see no CUDA device; `kyb-dra-plugin doctor` says whose each instance is: %w",
			gpu, placed, callErr("SetMigMode", nvml.ERROR_IN_USE))
	}
	if mig.ModeChangeNeedsReset(arch) {
		return fmt.Errorf("GPU %d (%s) is in MIG mode, so a container given it whole would see no CUDA device, and on %s GPUs turning it off needs a GPU reset with no process on the GPU, which the plugin does not do: drain the GPU, then run `nvidia-smi -i %d -mig 0` and `nvidia-smi -i %d --gpu-reset` (or reboot the node)",
			gpu, arch, arch, gpu, gpu)
	}
	if m.step("SetMigMode") {
		return errCrashed
	}
	activation, ret := dev.SetMigMode(nvml.DEVICE_MIG_DISABLE)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: turn MIG mode off: %w", gpu, callErr("SetMigMode", ret))
	}
	if activation != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: turn MIG mode off: %w", gpu, callErr("SetMigMode (activation)", activation))
	}
	klog.FromContext(ctx).Info("Turned MIG mode off for a whole-GPU seat", "gpu", gpu, "architecture", arch)
	return nil
}
