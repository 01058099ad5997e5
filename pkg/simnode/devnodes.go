package simnode

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// The simulated node's kernel side of its device nodes: the majors it
// lists in /proc/devices, the nodes in its /dev, the MIG capability files
// under /proc/driver/nvidia/capabilities, and whether the simulated
// plugin process may open a node. A real node's kernel allocates the
// nvidia-uvm and nvidia-caps majors when the modules load (an H200 listed
// 238 and 241; the presets list 511 and 238), so the numbers come from
// the topology (uvmMajor, capsMajor) and reach the plugin only as a real
// node's do: through /proc/devices and the nodes themselves. Code that
// assumed a number fails over a node that lists another.
//
// NVML makes and destroys MIG instances only for a process that holds the
// MIG config capability: it reads the capability's minor from
// /proc/driver/nvidia/capabilities/mig/config and opens
// /dev/nvidia-caps/nvidia-cap<minor>, which the driver makes readable by
// root only. The simulated NVML asks the same (mayConfigureMIG): a node
// whose config capability the process cannot open answers those calls
// ERROR_NO_PERMISSION, as real NVML does. The MIG placements of a GPU
// need a privileged process too (nvml.h: "Requires privileged user"):
// root, or one that holds either MIG capability (mayReadMIGPlacements);
// the profiles themselves are anyone's.

// DeviceFile is a device node as stat shows it.
type DeviceFile struct {
	Major, Minor int64
	// Mode holds the type (fs.ModeDevice|fs.ModeCharDevice for a
	// character device) and the permission bits.
	Mode fs.FileMode
	// UID owns the node.
	UID int
}

const charDevice = fs.ModeDevice | fs.ModeCharDevice

// capability is one of the driver's capabilities with a device node: the
// file under /proc/driver/nvidia/capabilities that names its minor, and
// the mode the driver gives its node.
type capability struct {
	name  string
	minor int64
	mode  fs.FileMode
}

// capabilities are the driver's MIG capabilities: config (make and
// destroy instances) for root only, monitor for everyone.
var capabilities = []capability{
	{name: "mig/config", minor: 1, mode: 0o400},
	{name: "mig/monitor", minor: 2, mode: 0o444},
}

// The kernel files the node serves.
const (
	procDevices      = "/proc/devices"
	procCapabilities = "/proc/driver/nvidia/capabilities/"
	procMIGMinors    = "/proc/driver/nvidia-caps/mig-minors"
)

// devNodes are the node's kernel files and device nodes, and what a test
// changed of its /dev and of the simulated process.
type devNodes struct {
	topo *v1alpha1.NodeTopology

	mu sync.Mutex
	// files replace (or, nil, remove) the node's own device nodes.
	files map[string]*DeviceFile
	// denied are nodes the process's device cgroup refuses.
	denied map[string]bool
	// uid is the simulated process's user; 0 (root) unless set.
	uid int
}

func (v *devNodes) capsMajor() int64 { return *v.topo.CapsMajor }

func (v *devNodes) uvmMajor() int64 { return *v.topo.UVMMajor }

// ProcFile returns a kernel file of the node: /proc/devices,
// /proc/driver/nvidia-caps/mig-minors, or a capability file under
// /proc/driver/nvidia/capabilities.
func (v *devNodes) ProcFile(name string) ([]byte, error) {
	switch {
	case name == procDevices:
		return v.ProcDevicesFile(), nil
	case name == procMIGMinors:
		return v.MIGMinorsFile(), nil
	case strings.HasPrefix(name, procCapabilities):
		rest := strings.TrimPrefix(name, procCapabilities)
		if i := slices.IndexFunc(capabilities, func(c capability) bool { return c.name == rest }); i >= 0 {
			c := capabilities[i]
			return fmt.Appendf(nil, "DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", c.minor, c.mode), nil
		}
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

// ProcDevicesFile is the node's /proc/devices: its character and block
// device majors by driver, as the kernel lists them, among them those of
// other NVIDIA modules, which a reader must not take for the ones it
// wants.
func (v *devNodes) ProcDevicesFile() []byte {
	type entry struct {
		major int64
		name  string
	}
	chars := []entry{{1, "mem"}, {4, "/dev/vc/0"}, {4, "tty"}, {5, "/dev/tty"}, {5, "/dev/console"}, {5, "/dev/ptmx"},
		{10, "misc"}, {136, "pts"}, {NVIDIADeviceMajor, "nvidia-frontend"}, {v.uvmMajor(), "nvidia-uvm"}, {v.capsMajor(), "nvidia-caps"}}
	used := map[int64]bool{}
	for _, e := range chars {
		used[e.major] = true
	}
	// The kernel hands out dynamic majors from 254 down (and from 511 down
	// past 234); the other NVIDIA modules take some.
	free := int64(254)
	for _, name := range []string{"nvidia-nvlink", "nvidia-caps-imex-channels", "nvidia-nvswitch"} {
		for used[free] {
			free--
		}
		used[free] = true
		chars = append(chars, entry{free, name})
	}
	slices.SortStableFunc(chars, func(a, b entry) int { return int(a.major - b.major) })
	var b bytes.Buffer
	b.WriteString("Character devices:\n")
	for _, e := range chars {
		fmt.Fprintf(&b, "%3d %s\n", e.major, e.name)
	}
	b.WriteString("\nBlock devices:\n  7 loop\n  8 sd\n  9 md\n253 device-mapper\n259 blkext\n")
	return b.Bytes()
}

// StatDevice returns the node at path in the node's /dev, or an error
// that is fs.ErrNotExist where there is none.
func (v *devNodes) StatDevice(p string) (DeviceFile, error) {
	p = path.Clean(p)
	v.mu.Lock()
	f, changed := v.files[p]
	v.mu.Unlock()
	if changed {
		if f == nil {
			return DeviceFile{}, &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist}
		}
		return *f, nil
	}
	if f, ok := v.ownDevice(p); ok {
		return f, nil
	}
	return DeviceFile{}, &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist}
}

// ownDevice is the node's own device node at p: the GPUs', nvidiactl,
// the UVM nodes, and a capability node for every minor the capabilities
// and mig-minors name.
func (v *devNodes) ownDevice(p string) (DeviceFile, bool) {
	base := path.Base(p)
	dir := path.Dir(p)
	switch {
	case dir == "/dev" && base == "nvidiactl":
		return DeviceFile{Major: NVIDIADeviceMajor, Minor: 255, Mode: charDevice | 0o666}, true
	case dir == "/dev" && base == "nvidia-uvm":
		return DeviceFile{Major: v.uvmMajor(), Minor: 0, Mode: charDevice | 0o666}, true
	case dir == "/dev" && base == "nvidia-uvm-tools":
		return DeviceFile{Major: v.uvmMajor(), Minor: 1, Mode: charDevice | 0o666}, true
	case dir == "/dev/nvidia-caps" && strings.HasPrefix(base, "nvidia-cap"):
		m, err := strconv.Atoi(strings.TrimPrefix(base, "nvidia-cap"))
		if err != nil || strconv.Itoa(m) != strings.TrimPrefix(base, "nvidia-cap") {
			return DeviceFile{}, false
		}
		for _, c := range capabilities {
			if c.minor == int64(m) {
				return DeviceFile{Major: v.capsMajor(), Minor: c.minor, Mode: charDevice | c.mode}, true
			}
		}
		if v.isCapMinor(m) {
			return DeviceFile{Major: v.capsMajor(), Minor: int64(m), Mode: charDevice | 0o444}, true
		}
	case dir == "/dev" && strings.HasPrefix(base, "nvidia"):
		m, err := strconv.Atoi(strings.TrimPrefix(base, "nvidia"))
		if err != nil || strconv.Itoa(m) != strings.TrimPrefix(base, "nvidia") {
			return DeviceFile{}, false
		}
		if slices.Contains(v.gpuMinors(), m) {
			return DeviceFile{Major: NVIDIADeviceMajor, Minor: int64(m), Mode: charDevice | 0o666}, true
		}
	}
	return DeviceFile{}, false
}

// DeviceNumbers returns the numbers of a device node of the node's /dev.
func (v *devNodes) DeviceNumbers(devPath string) (major, minor int64, err error) {
	f, err := v.StatDevice(devPath)
	if err != nil {
		return 0, 0, fmt.Errorf("simulated node has no device %s", devPath)
	}
	if f.Mode.Type() != charDevice {
		return 0, 0, fmt.Errorf("simulated node's %s is not a character device", devPath)
	}
	return f.Major, f.Minor, nil
}

// OpenDevice opens a device node for reading as the simulated process
// would, and closes it: an error that is fs.ErrNotExist where there is
// no node, fs.ErrPermission where the node's mode does not let the
// process's user read it (syscall.EACCES) or its device cgroup refuses
// the node (syscall.EPERM).
func (v *devNodes) OpenDevice(p string) error {
	p = path.Clean(p)
	f, err := v.StatDevice(p)
	if err != nil {
		return &fs.PathError{Op: "open", Path: p, Err: syscall.ENOENT}
	}
	v.mu.Lock()
	denied, uid := v.denied[p], v.uid
	v.mu.Unlock()
	// Root without capabilities, as the chart runs the plugin, reads a
	// node as its owner: by the owner's bits.
	bit := fs.FileMode(0o004)
	if uid == f.UID {
		bit = 0o400
	}
	switch {
	case f.Mode&bit == 0:
		return &fs.PathError{Op: "open", Path: p, Err: syscall.EACCES}
	case denied && f.Mode.Type() == charDevice:
		return &fs.PathError{Op: "open", Path: p, Err: syscall.EPERM}
	}
	return nil
}

// SetDevice makes the node at p what f says (as an administrator's mknod
// or chmod does), or removes it where f is nil (rm).
func (v *devNodes) SetDevice(p string, f *DeviceFile) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.files == nil {
		v.files = map[string]*DeviceFile{}
	}
	if f != nil {
		c := *f
		f = &c
	}
	v.files[path.Clean(p)] = f
}

// DenyDevice makes the simulated process's device cgroup refuse the node
// at p, as it refuses a container that is not privileged every device its
// runtime did not give it.
func (v *devNodes) DenyDevice(p string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.denied == nil {
		v.denied = map[string]bool{}
	}
	v.denied[path.Clean(p)] = true
}

// SetProcessUID makes the simulated process run as uid (root, 0, unless
// set).
func (v *devNodes) SetProcessUID(uid int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.uid = uid
}

// mayReadMIGPlacements says whether the simulated process is privileged
// as NVML's placement query asks: root, or holding the MIG config or
// monitor capability.
func (v *devNodes) mayReadMIGPlacements() bool {
	v.mu.Lock()
	uid := v.uid
	v.mu.Unlock()
	return uid == 0 || slices.ContainsFunc(capabilities, func(c capability) bool {
		return v.OpenDevice(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", c.minor)) == nil
	})
}

// mayConfigureMIG says whether the simulated process holds the MIG config
// capability: NVML reads its minor from the capability file and opens
// that node.
func (v *devNodes) mayConfigureMIG() bool {
	return v.OpenDevice(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", capabilities[0].minor)) == nil
}
