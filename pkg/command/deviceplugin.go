package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/deviceplugin"
)

const devicePluginUsage = `Usage: kyb-device-plugin [flags]

Runs the kyb device-plugin shim on this node, for clusters without DRA:
serves each seat profile as an extended resource (kyb.ai/gpu-1x-seat, ...)
through the kubelet's device-plugin API, one device per seat. It reads the
same node configuration as the DRA plugin and serves its exclusive layout,
in which no GPU serves two profiles that exclude each other. A node runs
the DRA plugin or this shim, never both: each refuses to start while the
other answers on its socket. Every flag can also be set by the environment
variable named beside it; a flag given on the command line wins.

  kyb-device-plugin                                   # on a GPU node
  kyb-device-plugin --injection cdi                   # containerd 1.7+ / CRI-O 1.24+ with CDI
  kyb-device-plugin --simulate dgx-h100 --device-plugin-directory-path /tmp/dp

Flags:
`

// shimFlags are the flags of the device-plugin shim.
type shimFlags struct {
	nodeSource
	healthFlags
	devicePluginDir string
	pluginsDir      string
	cdiRoot         string
	injection       *oneOf
	driverFiles     *oneOf
	hostDriverRoot  string
}

func (s *shimFlags) register(f *flags) {
	s.nodeSource.register(f, "")
	s.healthFlags.register(f)
	f.StringVar(&s.devicePluginDir, "device-plugin-directory-path", "/var/lib/kubelet/device-plugins/", "the kubelet's device-plugin directory, holding kubelet.sock and the shim's sockets")
	f.bind("device-plugin-directory-path", "DEVICE_PLUGIN_DIRECTORY_PATH")
	f.StringVar(&s.pluginsDir, "kubelet-plugins-directory-path", "/var/lib/kubelet/plugins", "the kubelet's plugin directory; the shim refuses to start while the DRA plugin answers in <dir>/gpu.kyb.ai")
	f.bind("kubelet-plugins-directory-path", "KUBELET_PLUGINS_DIRECTORY_PATH")
	f.StringVar(&s.cdiRoot, "cdi-root", "/var/run/cdi", "directory the container runtime reads CDI specs from (with --injection=cdi)")
	f.bind("cdi-root", "CDI_ROOT")
	s.injection = &oneOf{value: string(deviceplugin.InjectionEnvVar), allowed: []string{string(deviceplugin.InjectionEnvVar), string(deviceplugin.InjectionCDI)}}
	f.Var(s.injection, "injection", "how containers get their seats: envvar (environment, device nodes and driver mounts in the Allocate response; any runtime) or cdi (a CDI spec per container, named in the response; runtimes with CDI)")
	f.bind("injection", "KYB_INJECTION")
	s.driverFiles = &oneOf{value: "auto", allowed: []string{"auto", "nvidia-cdi", "driver-root", "none"}}
	f.Var(s.driverFiles, "driver-files", "how containers get the driver's libraries and tools: auto (with --injection=cdi NVIDIA's CDI spec if the node has one; else the files under --driver-root), nvidia-cdi (needs --injection=cdi), driver-root or none")
	f.bind("driver-files", "KYB_DRIVER_FILES")
	f.StringVar(&s.hostDriverRoot, "host-driver-root", "", "where --driver-root is on the host, when the shim sees it elsewhere; default: the same path")
	f.bind("host-driver-root", "NVIDIA_HOST_DRIVER_ROOT")
}

// DevicePlugin is the kyb-device-plugin command.
func DevicePlugin(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	f := newFlags("kyb-device-plugin", stderr)
	var s shimFlags
	s.register(f)
	return execute("kyb-device-plugin", devicePluginUsage, f, args, getenv, s.check, func() error { return runShim(ctx, &s) })
}

func (s *shimFlags) check() error {
	for _, d := range []struct{ flag, path string }{
		{"--device-plugin-directory-path", s.devicePluginDir},
		{"--kubelet-plugins-directory-path", s.pluginsDir},
		{"--cdi-root", s.cdiRoot},
	} {
		if !filepath.IsAbs(d.path) {
			return fmt.Errorf("%s %q must be an absolute path", d.flag, d.path)
		}
	}
	if s.driverFiles.value == "nvidia-cdi" && s.injection.value != string(deviceplugin.InjectionCDI) {
		return errors.New("--driver-files=nvidia-cdi needs --injection=cdi: NVIDIA's CDI entries reach a container only as CDI devices")
	}
	return s.healthFlags.check(&s.nodeSource)
}

func runShim(ctx context.Context, s *shimFlags) error {
	logger := klog.FromContext(ctx)
	node, err := s.load(ctx)
	if err != nil {
		return err
	}
	defer node.host.Close()
	logger.Info("Node", "gpus", node.inv.Summary(), "source", node.host.Description)
	for _, w := range node.plan.Warnings {
		logger.Info("Plan", "warning", w)
	}
	injection := deviceplugin.Injection(s.injection.value)
	files, err := chooseDriverFiles(ctx, driverFilesRequest{
		mode: s.driverFiles.value, src: &s.nodeSource, hostDriverRoot: s.hostDriverRoot, cdiRoot: s.cdiRoot,
		nvidiaCDI: injection == deviceplugin.InjectionCDI,
	}, node)
	if err != nil {
		return err
	}
	// The shim has no API client: health changes show in ListAndWatch and
	// in the monitor's log.
	mon, stopHealth, err := startHealth(ctx, node, s.faultsFile)
	if err != nil {
		return err
	}
	defer stopHealth()
	p, err := deviceplugin.Start(ctx, deviceplugin.Options{
		NodeName:          s.nodeName,
		Inventory:         node.inv,
		Plan:              node.plan,
		Edits:             containeredits.Options{DeviceNumbers: node.host.DeviceNumbers, Driver: files.files},
		NVIDIACDIDevice:   files.nvidiaCDI,
		Injection:         injection,
		CDIRoot:           s.cdiRoot,
		DevicePluginDir:   s.devicePluginDir,
		KubeletPluginsDir: s.pluginsDir,
		Health:            mon,
	})
	if err != nil {
		return err
	}
	defer p.Stop()
	<-ctx.Done()
	logger.Info("Shutting down; removing the shim's sockets")
	return nil
}
