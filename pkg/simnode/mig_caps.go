package simnode

import (
	"bytes"
	"fmt"
	"slices"
)

// The kernel module lets a process use a MIG device only through
// capability device nodes, /dev/nvidia-caps/nvidia-cap<minor>: one for
// the GPU instance and one for the compute instance. It lists their
// minors in /proc/driver/nvidia-caps/mig-minors for every GPU instance
// and compute instance ID a GPU can have, made or not: config 1, monitor
// 2, then per GPU (by minor) fifteen GPU instances of one access line and
// eight compute instances each. A real node with GPU instance 2 holding
// compute instance 0 on GPU 0 has them as nvidia-cap21 and nvidia-cap22.

// migCapsGIs and migCapsCIs are how many GPU and compute instance IDs
// mig-minors lists per GPU and per GPU instance.
const (
	migCapsGIs = 15
	migCapsCIs = 8
)

// capMinor is the minor of gpuN/giM/access (ci < 0) or
// gpuN/giM/ciK/access.
func capMinor(gpuMinor, gi, ci int) int {
	base := 3 + gpuMinor*migCapsGIs*(1+migCapsCIs) + gi*(1+migCapsCIs)
	if ci < 0 {
		return base
	}
	return base + 1 + ci
}

// MIGMinorsFile is the node's /proc/driver/nvidia-caps/mig-minors.
func (v *devNodes) MIGMinorsFile() []byte {
	var b bytes.Buffer
	b.WriteString("config 1\nmonitor 2\n")
	for _, gpu := range v.gpuMinors() {
		for gi := range migCapsGIs {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", gpu, gi, capMinor(gpu, gi, -1))
			for ci := range migCapsCIs {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", gpu, gi, ci, capMinor(gpu, gi, ci))
			}
		}
	}
	return b.Bytes()
}

func (v *devNodes) gpuMinors() []int {
	var minors []int
	for _, g := range v.topo.GPUs {
		minors = append(minors, *g.Minor)
	}
	slices.Sort(minors)
	return minors
}

// DeviceNode is a character device a container is given.
type DeviceNode struct {
	Path         string
	Major, Minor int64
}

// MIGDeviceNodes are the device nodes a container needs to use the MIG
// device with the given UUID: its GPU's /dev/nvidiaN, nvidiactl, the UVM
// nodes, and the capability nodes of its GPU and compute instance.
func (m *migNode) MIGDeviceNodes(uuid string) ([]DeviceNode, error) {
	ci, ok := m.deviceByUUID(uuid)
	if !ok {
		return nil, fmt.Errorf("simulated node has no MIG device %s", uuid)
	}
	m.mu.Lock()
	gpu, gi, id := ci.gi.gpu.minor, ci.gi.id, ci.id
	m.mu.Unlock()
	uvm, caps := m.dev.uvmMajor(), m.dev.capsMajor()
	return []DeviceNode{
		{Path: fmt.Sprintf("/dev/nvidia%d", gpu), Major: NVIDIADeviceMajor, Minor: int64(gpu)},
		{Path: "/dev/nvidiactl", Major: NVIDIADeviceMajor, Minor: 255},
		{Path: "/dev/nvidia-uvm", Major: uvm, Minor: 0},
		{Path: "/dev/nvidia-uvm-tools", Major: uvm, Minor: 1},
		{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", capMinor(gpu, gi, -1)), Major: caps, Minor: int64(capMinor(gpu, gi, -1))},
		{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", capMinor(gpu, gi, id)), Major: caps, Minor: int64(capMinor(gpu, gi, id))},
	}, nil
}

// isCapMinor says whether nvidia-cap<minor> exists on the node.
func (v *devNodes) isCapMinor(minor int) bool {
	if minor == 1 || minor == 2 {
		return true
	}
	for _, gpu := range v.gpuMinors() {
		if minor >= capMinor(gpu, 0, -1) && minor <= capMinor(gpu, migCapsGIs-1, migCapsCIs-1) {
			return true
		}
	}
	return false
}
