package gpuhost

import (
	"strings"
	"testing"
)

// As a node lists them: the GPUs' major under either name, nvidia-uvm's
// chosen by the kernel.
const procDevicesText = `Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
236 nvidia-nvlink
237 nvidia-caps-imex-channels
238 nvidia-caps
239 nvidia-uvm
254 gpiochip

Block devices:
  8 sd
239 blk-uvm-decoy
`

func TestDeviceNumbersWithoutTheHostsDev(t *testing.T) {
	const file = "/proc/devices"
	tests := []struct {
		path         string
		major, minor int64
		wantErr      string
	}{
		{path: "/dev/nvidia0", major: 195, minor: 0},
		{path: "/dev/nvidia7", major: 195, minor: 7},
		{path: "/dev/nvidiactl", major: 195, minor: 255},
		{path: "/dev/nvidia-uvm", major: 239, minor: 0},
		{path: "/dev/nvidia-uvm-tools", major: 239, minor: 1},
		{path: "/dev/nvidia-caps/nvidia-cap21", major: 238, minor: 21},
		{path: "/dev/nvidia-caps/nvidia-capx", wantErr: "is not nvidia-cap<minor>"},
		{path: "/dev/nvidia-modeset", wantErr: "is not one of the NVIDIA driver's whose numbers are known"},
		{path: "/dev/sda", wantErr: "is not one of the NVIDIA driver's"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			major, minor, err := NVIDIADeviceNumbers(ParseMajors([]byte(procDevicesText)), file, tt.path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("%s: %d:%d %v, want an error saying %q", tt.path, major, minor, err, tt.wantErr)
				}
				return
			}
			if err != nil || major != tt.major || minor != tt.minor {
				t.Errorf("%s: %d:%d %v, want %d:%d", tt.path, major, minor, err, tt.major, tt.minor)
			}
		})
	}
	// Without the nvidia-uvm module, its nodes have no numbers: say so.
	noUVM := ParseMajors([]byte("Character devices:\n195 nvidia\n"))
	if _, _, err := NVIDIADeviceNumbers(noUVM, file, "/dev/nvidia-uvm"); err == nil || !strings.Contains(err.Error(), "the nvidia-uvm kernel module is not loaded") {
		t.Errorf("no nvidia-uvm: %v", err)
	}
	if major, minor, err := NVIDIADeviceNumbers(noUVM, file, "/dev/nvidia2"); err != nil || major != 195 || minor != 2 {
		t.Errorf("the GPUs' major named nvidia: %d:%d %v", major, minor, err)
	}
}

// A node under the dev root answers first: where the plugin sees the
// host's /dev (run by hand, or privileged), its numbers are the truth.
func TestDeviceNumbersPreferTheNodeItself(t *testing.T) {
	h := &Host{devRoot: "/"}
	major, minor, err := h.DeviceNumbers("/dev/null")
	if err != nil || major != 1 || minor != 3 {
		t.Errorf("/dev/null: %d:%d %v, want 1:3", major, minor, err)
	}
	if _, _, err := h.DeviceNumbers("/dev/../etc/hostname"); err == nil {
		t.Error("a file that is not a character device was taken for one")
	}
}
