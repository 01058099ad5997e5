package containeredits

import (
	"slices"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
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

// A container of sized seats learns each seat's size, in the order of
// KYB_GPU_SEAT; a request mixing sized and other seats gets no sizes
// rather than a list that does not line up with its seats.
func TestBuildSizedSeatsSayTheirSize(t *testing.T) {
	size := func(gib, pct int64) *v1alpha1.SeatSize {
		return &v1alpha1.SeatSize{MemoryBytes: gib << 30, ComputePercent: pct}
	}
	tests := []struct {
		name  string
		seats []Seat
		want  []string
	}{
		{"one sized seat", []Seat{{Group: "G01", Seats: []int{3}, Generations: []int64{2}, GPUs: gpus[:2], Size: size(20, 25)}},
			[]string{"KYB_SEAT_COMPUTE=25", "KYB_SEAT_MEMORY=21474836480"}},
		{"two sized seats", []Seat{
			{Group: "G01", Seats: []int{3}, Generations: []int64{2}, GPUs: gpus[:2], Size: size(20, 25)},
			{Group: "G01", Seats: []int{0}, Generations: []int64{9}, GPUs: gpus[:2], Size: size(4, 10)},
		}, []string{"KYB_GPU_SEAT=3,0", "KYB_SEAT_COMPUTE=25,10", "KYB_SEAT_MEMORY=21474836480,4294967296"}},
		{"a sized seat beside one that is not", []Seat{
			{Group: "G01", Seats: []int{3}, Generations: []int64{2}, GPUs: gpus[:2], Size: size(20, 25)},
			{Group: "G2", Seats: []int{0}, Generations: []int64{1}, GPUs: gpus[2:]},
		}, nil},
		{"no sized seat", []Seat{{Group: "G2", Seats: []int{0}, Generations: []int64{1}, GPUs: gpus[2:]}}, nil},
	}
	for _, tc := range tests {
		e, err := Build(tc.seats, Options{DeviceNumbers: numbers})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, kv := range e.Env {
			if strings.HasPrefix(kv, "KYB_SEAT_MEMORY=") || strings.HasPrefix(kv, "KYB_SEAT_COMPUTE=") || (tc.want != nil && strings.HasPrefix(kv, "KYB_GPU_SEAT=") && len(tc.seats) > 1) {
				got = append(got, kv)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
