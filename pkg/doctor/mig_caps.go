package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// A MIG device is usable in a container only through the capability
// device nodes of its GPU instance and compute instance
// (/dev/nvidia-caps/nvidia-cap<M>), whose minors the kernel module lists in
// /proc/driver/nvidia-caps/mig-minors. The plugin writes both into a
// claim's spec: the minor from mig-minors, the numbers from the host's
// node where it has one (else the nvidia-caps major of /proc/devices). A
// host node with other numbers than mig-minors says gives the container
// another instance's capability, or none.

// capNode is what the host has at a capability node's path: its numbers,
// or exists false.
type capNode struct {
	exists       bool
	major, minor int64
	// notChar names what is there instead of a character device.
	notChar string
}

// capsHost answers for the capability nodes of the host examined.
type capsHost struct {
	// node stats a device node path such as /dev/nvidia-caps/nvidia-cap21.
	node func(path string) (capNode, error)
	// major is the nvidia-caps region's character major.
	major func() (int64, error)
}

// capsHost is the examined host's: its device nodes (under the dev root,
// or the simulated node's /dev) and its /proc/devices.
func (x *migExam) capsHost() capsHost {
	return capsHost{
		node: func(p string) (capNode, error) {
			n, err := x.host.StatDevice(p)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				return capNode{}, nil
			case err != nil:
				return capNode{}, err
			case !n.CharDevice():
				return capNode{exists: true, notChar: fmt.Sprintf("not a character device (mode %s)", n.Mode)}, nil
			}
			return capNode{exists: true, major: n.Major, minor: n.Minor}, nil
		},
		major: func() (int64, error) { return x.host.CharMajor("nvidia-caps") },
	}
}

// readMinors reads and parses mig-minors once for the MIG checks.
func (x *migExam) readMinors() (*mig.Minors, error) {
	raw, err := x.host.MIGMinors()
	if err != nil {
		return nil, fmt.Errorf("read /proc/driver/nvidia-caps/mig-minors: %w", err)
	}
	m, err := mig.ParseMinors(raw, "/proc/driver/nvidia-caps/mig-minors")
	if err != nil {
		return nil, err
	}
	return &m, nil
}

// capabilities adds, for each instance, its capability minors and
// whether their device nodes are there with the right numbers.
func (x *migExam) capabilities(c Check, g inventory.GPU, instances []migInstance) Check {
	minors, minorsErr := x.minors, x.minorsErr
	if len(instances) == 0 {
		return c
	}
	if minorsErr != nil {
		return worse(c, Fail, minorsErr.Error(), "the plugin cannot give a container a MIG device without its capability minors: load the NVIDIA driver with MIG support (nvidia-smi mig -lgip), and check /proc/driver/nvidia-caps")
	}
	lines, status, fix := capabilityLines(*minors, x.capsHost(), g.Minor, instances)
	c.Details = append(c.Details, lines...)
	if status != OK {
		c = worse(c, status, "", fix)
	}
	return c
}

// capabilityLines checks each instance's access capabilities: listed in
// mig-minors, and their nodes character devices of the nvidia-caps major
// and the listed minor. A missing node is a warning (the runtime makes the
// container's from the spec's numbers, which the plugin then takes from
// /proc/devices); other numbers are a failure.
func capabilityLines(minors mig.Minors, host capsHost, gpuMinor int, instances []migInstance) ([]string, Status, string) {
	status, fix := OK, ""
	rank := map[Status]int{OK: 0, Warn: 1, Fail: 2}
	raise := func(s Status, f string) {
		if rank[s] > rank[status] {
			status, fix = s, f
		}
	}
	major, majorErr := host.major()
	var lines []string
	for _, in := range instances {
		type capability struct {
			key   mig.CapabilityKey
			minor int
			ok    bool
		}
		caps := []capability{{key: mig.CapabilityKey{GPU: gpuMinor, GI: in.gi, CI: -1}}}
		caps[0].minor, caps[0].ok = minors.GPUInstance(gpuMinor, in.gi)
		for _, ci := range in.cis {
			k := capability{key: mig.CapabilityKey{GPU: gpuMinor, GI: in.gi, CI: ci.ci}}
			k.minor, k.ok = minors.ComputeInstance(gpuMinor, in.gi, ci.ci)
			caps = append(caps, k)
		}
		var parts []string
		for _, cp := range caps {
			if !cp.ok {
				parts = append(parts, fmt.Sprintf("%s not in mig-minors", cp.key))
				raise(Fail, "mig-minors does not list an existing instance's capability: the kernel module and the driver NVML runs disagree (a driver upgraded without a reboot?); reboot the node or reload the NVIDIA modules")
				continue
			}
			path := fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", cp.minor)
			node, err := host.node(path)
			switch {
			case err != nil:
				parts = append(parts, fmt.Sprintf("%s %d: %v", cp.key, cp.minor, err))
				raise(Fail, "the capability device nodes cannot be read: check --dev-root")
			case !node.exists:
				parts = append(parts, fmt.Sprintf("%s %d: %s missing", cp.key, cp.minor, path))
				raise(Warn, "the container runtime makes a container's node from the numbers in the spec, which the plugin then takes from /proc/devices; tools on the host need the node: mknod -m 444 /dev/nvidia-caps/nvidia-cap<M> c <nvidia-caps major of /proc/devices> <M>")
			case node.notChar != "":
				parts = append(parts, fmt.Sprintf("%s %d: %s is %s", cp.key, cp.minor, path, node.notChar))
				raise(Fail, "remove what is at the capability node's path and make the node: mknod -m 444 /dev/nvidia-caps/nvidia-cap<M> c <nvidia-caps major of /proc/devices> <M>")
			case majorErr != nil:
				parts = append(parts, fmt.Sprintf("%s %d: %s %d:%d; %v", cp.key, cp.minor, path, node.major, node.minor, majorErr))
				raise(Fail, "the nvidia-caps major is not known: is the NVIDIA driver loaded with MIG support?")
			case node.major != major || node.minor != int64(cp.minor):
				parts = append(parts, fmt.Sprintf("%s %d: %s is %d:%d, want %d:%d", cp.key, cp.minor, path, node.major, node.minor, major, cp.minor))
				raise(Fail, "a capability node with other numbers than mig-minors says gives a container another instance's capability, or none: remove it and make it again, mknod -m 444 /dev/nvidia-caps/nvidia-cap<M> c <nvidia-caps major of /proc/devices> <M>")
			default:
				parts = append(parts, fmt.Sprintf("%s %s", cp.key, path))
			}
		}
		lines = append(lines, fmt.Sprintf("GI %d capabilities: %s", in.gi, strings.Join(parts, ", ")))
	}
	return lines, status, fix
}
