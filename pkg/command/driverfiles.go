package command

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
)

// nvidiaCDIDirs are where NVIDIA's container toolkit writes its CDI spec.
var nvidiaCDIDirs = []string{"/etc/cdi", "/var/run/cdi"}

// chooseDriverFiles decides how containers get the driver's user-space
// files, and says which way was chosen and why.
func (p *pluginFlags) chooseDriverFiles(ctx context.Context, node *loaded, opts *draplugin.Options) error {
	logger := klog.FromContext(ctx)
	mode := p.driverFiles.value
	if mode == "auto" && node.host.Simulated != nil && p.driverRoot == "/" {
		logger.Info("Driver files", "mode", "none", "reason", "simulated node without --driver-root")
		return nil
	}
	if mode == "auto" || mode == "nvidia-cdi" {
		dirs := append([]string{}, nvidiaCDIDirs...)
		if p.cdiRoot != "/var/run/cdi" {
			dirs = append(dirs, p.cdiRoot)
		}
		found, err := cdi.FindNVIDIADevices(dirs, node.inv.GPUs)
		if err == nil && len(found) == len(node.inv.GPUs) {
			opts.NVIDIACDIDevice = func(index int, _ string) string { return found[index] }
			logger.Info("Driver files", "mode", "nvidia-cdi", "reason", "the node has NVIDIA's CDI spec for every GPU; its entries bring the driver files")
			return nil
		}
		if mode == "nvidia-cdi" {
			return fmt.Errorf("--driver-files=nvidia-cdi: NVIDIA's CDI spec (nvidia.com/gpu) covers %d of %d GPUs in %v (generate it with 'nvidia-ctk cdi generate'): %v", len(found), len(node.inv.GPUs), dirs, err)
		}
	}
	if mode == "auto" || mode == "driver-root" {
		files, err := containeredits.FindDriverFiles(p.driverRoot, p.hostDriverRoot)
		if err != nil {
			return fmt.Errorf("find the driver's files under %s: %w", p.driverRoot, err)
		}
		if !files.Empty() {
			opts.Edits.Driver = files
			logger.Info("Driver files", "mode", "driver-root", "root", p.driverRoot, "libraries", len(files.Libraries), "binaries", len(files.Binaries))
			return nil
		}
		if mode == "driver-root" {
			return fmt.Errorf("--driver-files=driver-root: no NVIDIA driver libraries under %s; set --driver-root to where the driver is installed", p.driverRoot)
		}
	}
	if mode == "auto" {
		logger.Info("WARNING: no NVIDIA CDI spec and no driver libraries found; containers get their GPUs' device nodes but need the NVIDIA container runtime for the driver's libraries", "driverRoot", p.driverRoot)
	}
	return nil
}
