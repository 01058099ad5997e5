package containeredits

import (
	"slices"
	"testing"
)

// An MPS client gets the daemon's pipe directory read-only unless the
// operator asked for it writable, its shm directory writable, and its
// share in the environment.
func TestBuildMPSClientMountsThePipeDirectoryReadOnly(t *testing.T) {
	tests := []struct {
		name         string
		pipeWritable bool
		want         []Mount
	}{
		{"read-only pipe directory (default)", false, []Mount{
			{HostPath: "/mps/g0-1x/pipe", ContainerPath: "/tmp/nvidia-mps"},
			{HostPath: "/mps/g0-1x/shm", ContainerPath: "/dev/shm", Writable: true},
		}},
		{"writable pipe directory", true, []Mount{
			{HostPath: "/mps/g0-1x/pipe", ContainerPath: "/tmp/nvidia-mps", Writable: true},
			{HostPath: "/mps/g0-1x/shm", ContainerPath: "/dev/shm", Writable: true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &MPS{HostPipeDir: "/mps/g0-1x/pipe", ContainerPipeDir: "/tmp/nvidia-mps", PipeWritable: tc.pipeWritable,
				HostShmDir: "/mps/g0-1x/shm", ActiveThreadPercentage: 25, PinnedMemLimit: "0=20480M"}
			e, err := Build([]Seat{{Group: "G0", Seats: []int{1}, Generations: []int64{3}, GPUs: gpus[:1]}}, Options{DeviceNumbers: numbers, MPS: m})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(e.Mounts, tc.want) {
				t.Errorf("mounts %+v, want %+v", e.Mounts, tc.want)
			}
			for _, kv := range []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"} {
				if !slices.Contains(e.Env, kv) {
					t.Errorf("env %v lacks %s", e.Env, kv)
				}
			}
		})
	}
}
