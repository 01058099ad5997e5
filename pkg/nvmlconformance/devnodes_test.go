package nvmlconformance

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// A node whose /dev/nvidia-uvm is a node left from an earlier load of
// the nvidia-uvm module, under the major it had then, while /proc/devices
// lists the major it has now: what a container is given from the node's
// numbers is no UVM device. On a real node the suite stats the node and
// fails device-numbers; a simulated node in the same state must fail it
// too, or the check compares /proc/devices with itself and can never
// notice a simulated /dev that drifted.
func TestDeviceNumbersFailAStaleNodeOnASimulatedNode(t *testing.T) {
	n := load(t, "dgx-h200")
	n.SetDevice("/dev/nvidia-uvm", &simnode.DeviceFile{Major: 511, Minor: 0, Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666})
	r := run(t, n, nil)
	got, ok := r.Find(CheckDeviceNumbers, NodeWide)
	if !ok {
		t.Fatal("no device-numbers result")
	}
	if got.Status != Fail || !strings.Contains(got.Message, "/dev/nvidia-uvm") {
		t.Errorf("device-numbers over a /dev/nvidia-uvm of 511:0 while /proc/devices lists nvidia-uvm 238: %s %q; want a failure naming /dev/nvidia-uvm", got.Status, got.Message)
	}
}
