package nodesetup

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
)

// The modes of --driver-files.
const (
	DriverFilesAuto       = "auto"
	DriverFilesNVIDIACDI  = "nvidia-cdi"
	DriverFilesDriverRoot = "driver-root"
	DriverFilesNone       = "none"
)

// defaultCDIRoot is where runtimes read CDI specs by default, and where
// NVIDIA's toolkit writes its transient spec.
const defaultCDIRoot = "/var/run/cdi"

// nvidiaCDIDirs are where NVIDIA's container toolkit writes its CDI spec.
var nvidiaCDIDirs = []string{"/etc/cdi", defaultCDIRoot}

// NVIDIACDIDirs are where the plugin looks for NVIDIA's CDI spec, given
// its own --cdi-root.
func NVIDIACDIDirs(cdiRoot string) []string {
	dirs := append([]string{}, nvidiaCDIDirs...)
	if cdiRoot != defaultCDIRoot {
		dirs = append(dirs, cdiRoot)
	}
	return dirs
}

// DriverFilesFlags say how containers get the driver's user-space files.
type DriverFilesFlags struct {
	Mode           *cli.OneOf
	HostDriverRoot string
}

// AddFlags defines the flags; modeUsage describes --driver-files for the
// daemon at hand, which the help calls daemon ("plugin", "shim").
func (d *DriverFilesFlags) AddFlags(f *cli.FlagSet, daemon, modeUsage string) {
	d.Mode = cli.NewOneOf(DriverFilesAuto, DriverFilesAuto, DriverFilesNVIDIACDI, DriverFilesDriverRoot, DriverFilesNone)
	f.Var(d.Mode, "driver-files", "KYB_DRIVER_FILES", modeUsage)
	f.StringVar(&d.HostDriverRoot, "host-driver-root", "NVIDIA_HOST_DRIVER_ROOT", "", "where --driver-root is on the host, when the "+daemon+" sees it elsewhere; default: the same path")
}

// DriverFiles is how containers get the driver's files: NVIDIA's CDI
// device per GPU, or bind mounts of the files, or neither.
type DriverFiles struct {
	// NVIDIACDI names NVIDIA's own CDI device for a GPU; its entry brings
	// the driver files.
	NVIDIACDI func(index int, uuid string) string
	// Files are bind-mounted from the driver root, looked at again
	// whenever it changes; nil when containers get none.
	Files *containeredits.DriverRoot
	// Mode is the way chosen (nvidia-cdi, driver-root or none) and Reason
	// says why, for logs and the doctor.
	Mode   string
	Reason string
}

// ChooseDriverFiles decides how containers get the driver's user-space
// files, and says which way was chosen and why. nvidiaCDIUsable says
// whether NVIDIA's CDI entries can reach the container at all (only as
// CDI devices); cdiRoot is where the daemon writes its own specs.
func (d *DriverFilesFlags) ChooseDriverFiles(ctx context.Context, node *Node, src *Flags, cdiRoot string, nvidiaCDIUsable bool) (DriverFiles, error) {
	logger := klog.FromContext(ctx)
	mode := d.Mode.Value()
	if mode == DriverFilesAuto && node.Host.Simulated != nil && src.DriverRoot == "/" {
		df := DriverFiles{Mode: DriverFilesNone, Reason: "simulated node without --driver-root"}
		logger.Info("Driver files", "mode", df.Mode, "reason", df.Reason)
		return df, nil
	}
	if (mode == DriverFilesAuto && nvidiaCDIUsable) || mode == DriverFilesNVIDIACDI {
		dirs := NVIDIACDIDirs(cdiRoot)
		found, err := cdi.FindNVIDIADevices(ctx, dirs, node.Inv.GPUs)
		if err == nil && len(found) == len(node.Inv.GPUs) {
			df := DriverFiles{NVIDIACDI: func(index int, _ string) string { return found[index] }, Mode: DriverFilesNVIDIACDI,
				Reason: "the node has NVIDIA's CDI spec for every GPU; its entries bring the driver files"}
			logger.Info("Driver files", "mode", df.Mode, "reason", df.Reason)
			return df, nil
		}
		if mode == DriverFilesNVIDIACDI {
			return DriverFiles{}, fmt.Errorf("--driver-files=nvidia-cdi: NVIDIA's CDI spec (nvidia.com/gpu) covers %d of %d GPUs in %v (generate it with 'nvidia-ctk cdi generate'): %v", len(found), len(node.Inv.GPUs), dirs, err)
		}
	}
	if mode == DriverFilesAuto || mode == DriverFilesDriverRoot {
		// The root is looked at again before each container is prepared:
		// a driver upgraded, or a driver container that was not ready at
		// start, is what the next container gets.
		root := containeredits.NewDriverRoot(src.DriverRoot, d.HostDriverRoot, mode == DriverFilesDriverRoot)
		files, err := root.Look()
		if err != nil {
			return DriverFiles{}, fmt.Errorf("find the driver's files under %s: %w", src.DriverRoot, err)
		}
		if !files.Empty() {
			logger.Info("Driver files", "mode", DriverFilesDriverRoot, "root", src.DriverRoot, "libraries", len(files.Libraries), "binaries", len(files.Binaries))
			return DriverFiles{Files: root, Mode: DriverFilesDriverRoot, Reason: "the driver's libraries are under " + src.DriverRoot + "; containers get them as bind mounts"}, nil
		}
		if mode == DriverFilesDriverRoot {
			// Not ready yet, perhaps: each prepare fails, saying so, until
			// the libraries are there.
			df := DriverFiles{Files: root, Mode: DriverFilesDriverRoot, Reason: "no NVIDIA driver libraries under " + src.DriverRoot + " yet; prepares fail until they are there"}
			logger.Info("Driver files", "mode", df.Mode, "root", src.DriverRoot, "warning", df.Reason)
			return df, nil
		}
		if node.Host.Simulated == nil {
			df := DriverFiles{Files: root, Mode: DriverFilesNone, Reason: "no NVIDIA CDI spec and no driver libraries under " + src.DriverRoot + " now; containers get their GPUs' device nodes, and the driver's libraries once they appear there (else the NVIDIA container runtime must bring them)"}
			logger.Info("Driver files", "mode", df.Mode, "driverRoot", src.DriverRoot, "warning", df.Reason)
			return df, nil
		}
	}
	df := DriverFiles{Mode: DriverFilesNone, Reason: "--driver-files=none"}
	if mode == DriverFilesAuto {
		df.Reason = "no NVIDIA CDI spec and no driver libraries found; containers get their GPUs' device nodes but need the NVIDIA container runtime for the driver's libraries"
		logger.Info("Driver files", "mode", df.Mode, "driverRoot", src.DriverRoot, "warning", df.Reason)
	}
	return df, nil
}

// Source is where containers' driver files come from; nil when they get
// none from the plugin.
func (d DriverFiles) Source() containeredits.DriverSource {
	if d.Files == nil {
		return nil
	}
	return d.Files
}
