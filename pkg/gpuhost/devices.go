package gpuhost

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The kernel's side of the NVIDIA device nodes, read the same way on a
// real node and on a simulated one: a real node's files, or the simulated
// node's answers. The NVIDIA driver registers one fixed major for the GPUs
// and nvidiactl; the nvidia-uvm and nvidia-caps modules get theirs when
// they load (an H200 had 238 and 241), so those are only ever read from
// /proc/devices.

// ProcDevices lists the kernel's character and block device majors. Like
// /proc/driver, it is not namespaced: a container reads the host's.
const ProcDevices = "/proc/devices"

// NVIDIAMajor is the character major the NVIDIA driver registers for the
// GPUs (minor N: /dev/nvidia<N>) and its control nodes (254
// nvidia-modeset, 255 nvidiactl), which /proc/devices names
// nvidia-frontend or nvidia. It is the one major that does not change.
const NVIDIAMajor = 195

// CapabilitiesDir holds the driver's capability files, such as mig/config.
const CapabilitiesDir = "/proc/driver/nvidia/capabilities"

const charDevice = fs.ModeDevice | fs.ModeCharDevice

// ReadProcFile reads a kernel file: /proc/devices, a file under
// /proc/driver. A real node's, or the simulated node's.
func (h *Host) ReadProcFile(name string) ([]byte, error) {
	if h.Simulated != nil {
		return h.Simulated.ProcFile(name)
	}
	return os.ReadFile(name)
}

// DeviceNode is a device node as stat shows it.
type DeviceNode struct {
	Major, Minor int64
	// Mode holds the type (fs.ModeDevice|fs.ModeCharDevice for a
	// character device) and the permission bits.
	Mode fs.FileMode
	UID  int
}

// CharDevice says whether the node is a character device.
func (d DeviceNode) CharDevice() bool { return d.Mode.Type() == charDevice }

// StatDevice returns what is at a device node's path, such as
// /dev/nvidia-caps/nvidia-cap1: under the dev root on a real node, in the
// simulated node's /dev. Nothing there is an error that is
// fs.ErrNotExist.
func (h *Host) StatDevice(devPath string) (DeviceNode, error) {
	if h.Simulated != nil {
		f, err := h.Simulated.StatDevice(devPath)
		return DeviceNode{Major: f.Major, Minor: f.Minor, Mode: f.Mode, UID: f.UID}, err
	}
	p := filepath.Join(h.devRoot, devPath)
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return DeviceNode{}, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	mode := fs.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		mode |= charDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFREG:
	default:
		mode |= fs.ModeIrregular
	}
	return DeviceNode{Major: int64(unix.Major(uint64(st.Rdev))), Minor: int64(unix.Minor(uint64(st.Rdev))), Mode: mode, UID: int(st.Uid)}, nil
}

// OpenDevice opens a device node for reading and closes it again, as a
// test of whether this process may: opening a capability node grants
// nothing until the file is handed to the driver. On a real node the
// errors are open(2)'s: EACCES where the node's mode refuses this
// process's user, EPERM where its device cgroup refuses the node.
func (h *Host) OpenDevice(devPath string) error {
	if h.Simulated != nil {
		return h.Simulated.OpenDevice(devPath)
	}
	p := filepath.Join(h.devRoot, devPath)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return unix.Close(fd)
}

// Majors are the character-device majors of a /proc/devices, by driver
// name.
type Majors map[string]int64

// ParseMajors reads the character devices of a /proc/devices; block
// devices, whose majors are another space, are left out.
func ParseMajors(raw []byte) Majors {
	majors := Majors{}
	char := false
	s := bufio.NewScanner(bytes.NewReader(raw))
	for s.Scan() {
		line := s.Text()
		switch strings.TrimSpace(line) {
		case "Character devices:":
			char = true
			continue
		case "Block devices:":
			char = false
			continue
		}
		fields := strings.Fields(line)
		if !char || len(fields) != 2 {
			continue
		}
		if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			majors[fields[1]] = n
		}
	}
	return majors
}

// CharMajor reads a driver's character major from the node's
// /proc/devices, such as nvidia-caps's.
func (h *Host) CharMajor(name string) (int64, error) {
	raw, err := h.ReadProcFile(ProcDevices)
	if err != nil {
		return 0, err
	}
	major, ok := ParseMajors(raw)[name]
	if !ok {
		return 0, fmt.Errorf("%s lists no %s character major", ProcDevices, name)
	}
	return major, nil
}

// NVIDIADeviceNumbers returns the numbers of one of the NVIDIA driver's
// device nodes from the majors of file (a /proc/devices) and the minors the
// driver gives its nodes.
func NVIDIADeviceNumbers(majors Majors, file, devPath string) (int64, int64, error) {
	base := path.Base(devPath)
	switch {
	case base == "nvidia-uvm" || base == "nvidia-uvm-tools":
		major, ok := majors["nvidia-uvm"]
		if !ok {
			return 0, 0, fmt.Errorf("device node %s: the nvidia-uvm kernel module is not loaded (%s lists no nvidia-uvm)", devPath, file)
		}
		if base == "nvidia-uvm" {
			return major, 0, nil
		}
		return major, 1, nil
	case base == "nvidiactl":
		return nvidiaMajorIn(majors), 255, nil
	case strings.HasPrefix(base, "nvidia-cap") && path.Base(path.Dir(devPath)) == "nvidia-caps":
		// The MIG capabilities' nodes: their minors come from mig-minors
		// and the capability files, their major is the nvidia-caps
		// region's.
		minor, err := strconv.ParseInt(strings.TrimPrefix(base, "nvidia-cap"), 10, 64)
		major, ok := majors["nvidia-caps"]
		switch {
		case err != nil || minor < 0:
			return 0, 0, fmt.Errorf("device node %s is not nvidia-cap<minor>", devPath)
		case !ok:
			return 0, 0, fmt.Errorf("device node %s: %s lists no nvidia-caps major (the NVIDIA driver has no MIG capabilities)", devPath, file)
		}
		return major, minor, nil
	case strings.HasPrefix(base, "nvidia"):
		if minor, err := strconv.ParseInt(strings.TrimPrefix(base, "nvidia"), 10, 64); err == nil && minor >= 0 && minor < 255 {
			return nvidiaMajorIn(majors), minor, nil
		}
	}
	return 0, 0, fmt.Errorf("device node %s is not visible, and is not one of the NVIDIA driver's whose numbers are known", devPath)
}

func nvidiaMajorIn(majors Majors) int64 {
	for _, name := range []string{"nvidia-frontend", "nvidia"} {
		if m, ok := majors[name]; ok {
			return m
		}
	}
	return NVIDIAMajor
}

// Capability is one of the driver's capabilities with a device node, as
// its file under CapabilitiesDir describes it.
type Capability struct {
	// File is the capability's file, such as
	// /proc/driver/nvidia/capabilities/mig/config.
	File string
	// Minor is the minor of its node, /dev/nvidia-caps/nvidia-cap<Minor>.
	Minor int64
	// Mode is the mode the driver gives the node.
	Mode fs.FileMode
}

// Node is the capability's device node.
func (c Capability) Node() string { return fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", c.Minor) }

// ReadCapability reads a capability file, such as mig/config, as NVML
// does to find the capability's node: "DeviceFileMinor: 1",
// "DeviceFileMode: 256" (decimal), "DeviceFileModify: 1".
func (h *Host) ReadCapability(name string) (Capability, error) {
	file := path.Join(CapabilitiesDir, name)
	raw, err := h.ReadProcFile(file)
	if err != nil {
		return Capability{File: file, Minor: -1}, err
	}
	return parseCapability(file, raw)
}

func parseCapability(file string, raw []byte) (Capability, error) {
	c := Capability{File: file, Minor: -1}
	s := bufio.NewScanner(bytes.NewReader(raw))
	for s.Scan() {
		key, value, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		switch key = strings.TrimSpace(key); {
		case key != "DeviceFileMinor" && key != "DeviceFileMode":
		case err != nil || n < 0:
			return c, fmt.Errorf("%s: %s %q is not a number", c.File, key, strings.TrimSpace(value))
		case key == "DeviceFileMinor":
			c.Minor = n
		default:
			c.Mode = fs.FileMode(n) & fs.ModePerm
		}
	}
	if c.Minor < 0 {
		return c, fmt.Errorf("%s names no DeviceFileMinor", c.File)
	}
	return c, nil
}
