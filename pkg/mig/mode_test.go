package mig

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestModeChangeNeedsReset(t *testing.T) {
	for arch, want := range map[string]bool{"ampere": true, "hopper": false, "blackwell": false, "": true} {
		if got := ModeChangeNeedsReset(arch); got != want {
			t.Errorf("ModeChangeNeedsReset(%q) = %v, want %v", arch, got, want)
		}
	}
}

func TestModeFix(t *testing.T) {
	const on, off = nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_DISABLE
	tests := []struct {
		name             string
		arch             string
		current, pending int
		want             string
	}{
		{name: "in MIG mode", arch: "ampere", current: on, pending: on},
		{name: "in MIG mode, off pending", arch: "ampere", current: on, pending: off},
		{name: "Hopper turns it on at once", arch: "hopper", current: off, pending: off},
		{name: "Blackwell turns it on at once", arch: "blackwell", current: off, pending: off},
		{name: "Ampere, off", arch: "ampere", current: off, pending: off,
			want: "On ampere GPUs turning MIG mode on needs a GPU reset with no process on the GPU: drain the GPU, then run `nvidia-smi -i 3 -mig 1` and `nvidia-smi -i 3 --gpu-reset` (or reboot the node; the mode persists), then restart the plugin pod"},
		{name: "Ampere, on pending", arch: "ampere", current: off, pending: on,
			want: "MIG mode is pending: reset the GPU: drain it, then run `nvidia-smi -i 3 --gpu-reset` (or reboot the node), then restart the plugin pod"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ModeFix(3, tt.arch, tt.current, tt.pending); got != tt.want {
				t.Errorf("ModeFix(3, %q, %d, %d) = %q, want %q", tt.arch, tt.current, tt.pending, got, tt.want)
			}
		})
	}
}
