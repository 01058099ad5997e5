package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

// checkDriverFiles says how containers would get the driver's user-space
// files, as the plugin would choose at start, and whether those files are
// there now and match the driver NVML runs.
func (e *examination) checkDriverFiles(ctx context.Context) {
	if e.node == nil {
		e.skip("driver-files")
		return
	}
	// The choice logs what it decides; the report says it instead.
	quiet := klog.NewContext(ctx, klog.LoggerWithValues(klog.FromContext(ctx), "check", "driver-files").V(5))
	files, err := e.opts.DriverFiles.ChooseDriverFiles(quiet, e.node, &e.opts.Node, e.opts.CDIRoot, true)
	if err != nil {
		e.add(Check{Name: "driver-files", Status: Fail, Summary: err.Error(), Fix: "point --driver-root (NVIDIA_DRIVER_ROOT) at the driver's files, or choose another --driver-files mode"})
		return
	}
	e.files = &files
	c := Check{Name: "driver-files", Status: OK, Summary: files.Mode + ": " + files.Reason}
	switch files.Mode {
	case nodesetup.DriverFilesNone:
		if e.host.Simulated == nil {
			c.Status, c.Fix = Warn, "install NVIDIA's container toolkit and runtime, or generate NVIDIA's CDI spec (nvidia-ctk cdi generate), or set --driver-root to where the driver's libraries are"
		}
	case nodesetup.DriverFilesDriverRoot:
		found, err := files.Files.Files()
		if err != nil {
			c.Status, c.Summary, c.Fix = Fail, err.Error(), "install the driver under --driver-root, or wait for the driver container to be ready; prepares fail until then"
			break
		}
		var stale []string
		for _, f := range driverFiles(found) {
			c.Details = append(c.Details, f.container+" <- "+f.path)
			if v := libraryVersion(f.resolved); v != "" && v != e.node.Inv.DriverVersion {
				stale = append(stale, filepath.Base(f.resolved))
			}
		}
		if len(stale) > 0 && c.Status == OK {
			c.Status = Warn
			c.Summary += fmt.Sprintf("; not of driver %s: %s", e.node.Inv.DriverVersion, strings.Join(stale, ", "))
			c.Fix = "the driver root holds another driver's libraries than the one loaded: reboot after a driver upgrade, or point --driver-root at the loaded driver"
		}
	case nodesetup.DriverFilesNVIDIACDI:
		c.Details = append(c.Details, "containers get NVIDIA's CDI devices beside ours; the nvidia-cdi check looks at them")
	}
	e.add(c)
}

type driverFile struct{ path, resolved, container string }

// driverFiles are the files the plugin would bind-mount, as it sees them
// and where the container gets them.
func driverFiles(f *containeredits.DriverFiles) []driverFile {
	var out []driverFile
	for _, l := range slices.Concat(f.Libraries, f.Binaries) {
		for _, p := range l.ContainerPaths() {
			out = append(out, driverFile{path: l.Path, resolved: l.Resolved, container: p})
		}
	}
	return out
}

// libraryVersion is the driver version in a library's file name, such as
// 580.95.05 of libcuda.so.580.95.05; "" where the name has none (.so.1).
func libraryVersion(path string) string {
	_, v, ok := strings.Cut(filepath.Base(path), ".so.")
	if !ok || !strings.Contains(v, ".") {
		return ""
	}
	return v
}

// checkNVIDIACDI says whether NVIDIA's container toolkit left a CDI spec
// for the node's GPUs, and whether the files it names exist: a spec
// generated before a driver upgrade names libraries that are gone, and
// every container start that uses it fails.
func (e *examination) checkNVIDIACDI() {
	if e.node == nil {
		e.skip("nvidia-cdi")
		return
	}
	dirs := nodesetup.NVIDIACDIDirs(e.opts.CDIRoot)
	specs := cdi.ReadSpecDirs(dirs)
	found, err := specs.NVIDIADevices(e.node.Inv.GPUs)
	c := Check{Name: "nvidia-cdi", Status: OK}
	for _, err := range specs.Skipped {
		c.Status, c.Fix = Warn, "remove or correct the files left out: neither the plugin nor the container runtime uses them, and a FIFO or device named as a spec blocks a runtime that reads it (the plugin and the doctor read only regular files)"
		c.Details = append(c.Details, "left out: "+err.Error())
	}
	switch {
	case err != nil || len(found) == 0:
		c.Summary = fmt.Sprintf("no NVIDIA CDI spec in %s", strings.Join(dirs, ", "))
		if e.files != nil && e.files.Mode == nodesetup.DriverFilesNVIDIACDI {
			c.Status, c.Fix = Fail, "generate it: nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml"
		}
		e.add(c)
		return
	case len(found) < len(e.node.Inv.GPUs):
		c.Status = Warn
		c.Summary = fmt.Sprintf("NVIDIA's CDI spec covers %d of %d GPUs", len(found), len(e.node.Inv.GPUs))
		c.Fix = "generate it again (nvidia-ctk cdi generate): GPUs changed since it was written; until then the plugin does not use it"
	default:
		c.Summary = fmt.Sprintf("NVIDIA's CDI spec covers every GPU (%s)", strings.Join(dirs, ", "))
	}
	missing := specs.MissingHostPaths(cdi.NVIDIAKind)
	for _, p := range missing {
		c.Details = append(c.Details, "names a file that does not exist: "+p)
	}
	if len(missing) > 0 {
		c.Status = Fail
		c.Summary += fmt.Sprintf(", but names %s missing on this node", count(len(missing), "file"))
		c.Fix = "the spec is older than the driver: generate it again (nvidia-ctk cdi generate); every container given these devices fails to start until then"
	}
	e.add(c)
}

// checkCDIRoot says whether the plugin can write its specs where the
// runtime reads them, and whether they outlive a reboot there.
func (e *examination) checkCDIRoot() {
	dir := e.opts.CDIRoot
	c := Check{Name: "cdi-root", Status: OK}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		c.Status, c.Summary = Warn, dir+" does not exist; the plugin creates it"
		c.Fix = "check that the container runtime reads CDI specs from " + dir + " (the runtime check below), and that the plugin's pod mounts it from the host"
		e.add(c)
		return
	case err != nil:
		e.add(Check{Name: "cdi-root", Status: Fail, Summary: err.Error(), Fix: "mount the host's CDI directory into the plugin"})
		return
	case !fi.IsDir():
		e.add(Check{Name: "cdi-root", Status: Fail, Summary: dir + " is not a directory", Fix: "set --cdi-root (CDI_ROOT) to the runtime's CDI directory"})
		return
	}
	if err := probeWrite(dir); err != nil {
		e.add(Check{Name: "cdi-root", Status: Fail, Summary: "not writable: " + err.Error(), Fix: "mount " + dir + " read-write into the plugin, and run it as root"})
		return
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		c.Summary = dir + " is writable, on tmpfs: specs go with a reboot and the plugin writes them again from its checkpoint"
	} else {
		c.Summary = dir + " is writable, not on tmpfs: specs outlive a reboot and the plugin removes those of claims it no longer holds"
	}
	uids, skipped, err := cdi.ListClaims(dir)
	if err != nil {
		c.Status, c.Fix = Warn, "the plugin cannot list its specs there either: check the directory's permissions"
		c.Details = append(c.Details, err.Error())
	}
	c.Details = append(c.Details, fmt.Sprintf("%s of %s", count(len(uids), "claim spec"), driver.Name))
	for _, s := range skipped {
		c.Details = append(c.Details, "not the plugin's (left alone): "+s)
	}
	e.add(c)
}

// probeWrite creates and removes a file in dir.
func probeWrite(dir string) error {
	f, err := os.CreateTemp(dir, ".kyb-doctor-*")
	if err != nil {
		return err
	}
	name := f.Name()
	_ = f.Close() // empty file, removed next
	return os.Remove(name)
}

// checkKubeletDirs says whether the kubelet's directories the plugin
// writes are where the flags say: the registration directory, and its own
// directory under the plugins directory (or the plugins directory, where
// its own does not exist yet). It also says whether the other surface of
// the driver serves the node already.
func (e *examination) checkKubeletDirs() {
	c := Check{Name: "kubelet", Status: OK}
	dataDir := driver.PluginDir(e.opts.PluginsDir)
	dirs := []struct{ flag, dir string }{{"--kubelet-registrar-directory-path", e.opts.RegistrarDir}}
	if _, err := os.Stat(dataDir); err == nil {
		dirs = append(dirs, struct{ flag, dir string }{"--kubelet-plugins-directory-path", dataDir})
	} else {
		dirs = append(dirs, struct{ flag, dir string }{"--kubelet-plugins-directory-path", e.opts.PluginsDir})
	}
	var found []string
	for _, d := range dirs {
		fi, err := os.Stat(d.dir)
		if err != nil || !fi.IsDir() {
			c.Status = Fail
			c.Details = append(c.Details, fmt.Sprintf("%s: %s is not a directory", d.flag, d.dir))
			c.Fix = "mount the kubelet's directories (/var/lib/kubelet/plugins_registry and /var/lib/kubelet/plugins by default) into the plugin, or set the flags to where this kubelet keeps them (--root-dir of the kubelet)"
			continue
		}
		if err := probeWrite(d.dir); err != nil {
			c.Status = Fail
			c.Details = append(c.Details, fmt.Sprintf("%s: %s is not writable: %v", d.flag, d.dir, err))
			c.Fix = "mount the kubelet's directories read-write and run the plugin as root"
			continue
		}
		found = append(found, d.dir)
	}
	c.Summary = "writable: " + strings.Join(found, ", ")
	if c.Status == Fail {
		c.Summary = "the kubelet's plugin directories are not usable"
	}
	if err := driver.CheckNoLiveShim(e.opts.DevicePluginDir); err != nil {
		c.Status, c.Fix = Fail, "remove the device-plugin shim from this node (the chart's mode: dra) before the DRA plugin runs here"
		c.Details = append(c.Details, err.Error())
	}
	e.add(c)
}
