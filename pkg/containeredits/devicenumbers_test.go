package containeredits

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// A MIG seat's container gets its nodes with the numbers the node's
// kernel lists, here the majors an H200 node had (nvidia-uvm 238,
// nvidia-caps 241), which no preset has: a number assumed on the way
// from /proc/devices to the spec would show.
func TestMIGSeatDeviceNodesTakeTheNodesMajors(t *testing.T) {
	src, err := simnode.PresetSource("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(file, append(src, "uvmMajor: 238\ncapsMajor: 241\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	host, err := gpuhost.Open(ctx, gpuhost.Options{Simulate: file, NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = host.Close() }()
	seat := Seat{Group: "g2-mig-1g-10gb-0", Seats: []int{0}, Generations: []int64{1}, GPUs: []inventory.GPU{{Index: 2, Minor: 2, UUID: "GPU-cccc"}},
		MIG: &MIGDevice{UUID: "MIG-0b2a", CapabilityNodes: []string{"/dev/nvidia-caps/nvidia-cap291", "/dev/nvidia-caps/nvidia-cap292"}}}
	e, err := Build([]Seat{seat}, Options{DeviceNumbers: host.DeviceNumbers})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, d := range e.DeviceNodes {
		nodes = append(nodes, fmt.Sprintf("%s=%d:%d", d.Path, d.Major, d.Minor))
	}
	want := "/dev/nvidia2=195:2 /dev/nvidiactl=195:255 /dev/nvidia-uvm=238:0 /dev/nvidia-uvm-tools=238:1 /dev/nvidia-caps/nvidia-cap291=241:291 /dev/nvidia-caps/nvidia-cap292=241:292"
	if got := strings.Join(nodes, " "); got != want {
		t.Errorf("device nodes\n got %s\nwant %s", got, want)
	}
}
