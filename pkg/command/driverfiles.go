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

// chooseDriverFiles decides how the DRA plugin's containers get the
// driver's user-space files.
func (p *pluginFlags) chooseDriverFiles(ctx context.Context, node *loaded, opts *draplugin.Options) error {
	c, err := chooseDriverFiles(ctx, driverFilesRequest{mode: p.driverFiles.value, src: &p.nodeSource, hostDriverRoot: p.hostDriverRoot, cdiRoot: p.cdiRoot, nvidiaCDI: true}, node)
	if err != nil {
		return err
	}
	opts.NVIDIACDIDevice = c.nvidiaCDI
	opts.Edits.Driver = c.files
	return nil
}

// driverFilesRequest is what decides the driver files: the --driver-files
// mode and the roots, and whether NVIDIA's CDI entries can reach the
// container at all (only as CDI devices).
type driverFilesRequest struct {
	mode           string
	src            *nodeSource
	hostDriverRoot string
	cdiRoot        string
	nvidiaCDI      bool
}

// driverFilesChoice is how containers get the driver's files: NVIDIA's CDI
// device per GPU, or bind mounts of the files, or neither.
type driverFilesChoice struct {
	nvidiaCDI func(index int, uuid string) string
	files     *containeredits.DriverFiles
}

// chooseDriverFiles decides how containers get the driver's user-space
// files, and says which way was chosen and why. The DRA plugin and the
// device-plugin shim share it.
func chooseDriverFiles(ctx context.Context, req driverFilesRequest, node *loaded) (driverFilesChoice, error) {
	logger := klog.FromContext(ctx)
	mode := req.mode
	if mode == "auto" && node.host.Simulated != nil && req.src.driverRoot == "/" {
		logger.Info("Driver files", "mode", "none", "reason", "simulated node without --driver-root")
		return driverFilesChoice{}, nil
	}
	if (mode == "auto" && req.nvidiaCDI) || mode == "nvidia-cdi" {
		dirs := append([]string{}, nvidiaCDIDirs...)
		if req.cdiRoot != "/var/run/cdi" {
			dirs = append(dirs, req.cdiRoot)
		}
		found, err := cdi.FindNVIDIADevices(dirs, node.inv.GPUs)
		if err == nil && len(found) == len(node.inv.GPUs) {
			logger.Info("Driver files", "mode", "nvidia-cdi", "reason", "the node has NVIDIA's CDI spec for every GPU; its entries bring the driver files")
			return driverFilesChoice{nvidiaCDI: func(index int, _ string) string { return found[index] }}, nil
		}
		if mode == "nvidia-cdi" {
			return driverFilesChoice{}, fmt.Errorf("--driver-files=nvidia-cdi: NVIDIA's CDI spec (nvidia.com/gpu) covers %d of %d GPUs in %v (generate it with 'nvidia-ctk cdi generate'): %v", len(found), len(node.inv.GPUs), dirs, err)
		}
	}
	if mode == "auto" || mode == "driver-root" {
		files, err := containeredits.FindDriverFiles(req.src.driverRoot, req.hostDriverRoot)
		if err != nil {
			return driverFilesChoice{}, fmt.Errorf("find the driver's files under %s: %w", req.src.driverRoot, err)
		}
		if !files.Empty() {
			logger.Info("Driver files", "mode", "driver-root", "root", req.src.driverRoot, "libraries", len(files.Libraries), "binaries", len(files.Binaries))
			return driverFilesChoice{files: files}, nil
		}
		if mode == "driver-root" {
			return driverFilesChoice{}, fmt.Errorf("--driver-files=driver-root: no NVIDIA driver libraries under %s; set --driver-root to where the driver is installed", req.src.driverRoot)
		}
	}
	if mode == "auto" {
		logger.Info("WARNING: no NVIDIA CDI spec and no driver libraries found; containers get their GPUs' device nodes but need the NVIDIA container runtime for the driver's libraries", "driverRoot", req.src.driverRoot)
	}
	return driverFilesChoice{}, nil
}
