package draplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// A MIG seat's container is given the use of its MIG device: the
// processes NVML lists on that device's handle, with the device's memory,
// named by its MIG UUID and placement. A process of the container in
// another instance is no seat's.
func TestPerPodMIGUsageOverSockets(t *testing.T) {
	var e *env
	var u usageNode
	file := filepath.Join(t.TempDir(), "processes")
	e = newEnv(t, "dgx-h100", migConfig, func(x *env) {
		e = x
		withUsage(x, file, &u)(x)
		usage := x.opts
		withMIG(&crashPoint{})(x)
		mig := x.opts
		x.opts = func(o *draplugin.Options) { usage(o); mig(o) }
	})
	mine, other := e.claim(classMIG1g), e.claim(classMIG1g)
	if got := mine.Status.Allocation.Devices.Results[0].Device; got != "g0-mig-1g-10gb-6" {
		t.Fatalf("allocated %s, want g0-mig-1g-10gb-6", got)
	}
	envMine, _ := e.container(e.prepareOK(mine)...)
	e.prepareOK(other)
	migUUID := envMine["CUDA_VISIBLE_DEVICES"]
	if !strings.HasPrefix(migUUID, "MIG-") {
		t.Fatalf("the MIG seat's container sees %q", migUUID)
	}
	gi := e.gpu0InstanceID(6)
	otherGI := e.gpu0InstanceID(5)

	const uid = "aaaaaaaa-0000-4000-8000-00000000000a"
	id := strings.Repeat("a", 64)
	u.run(t, uid, mine.Namespace, "mig-trainer", "train", id, mine)
	cg := "0::/kubepods/besteffort/pod" + uid + "/" + id
	procs := []simnode.Process{
		{GPU: 0, GPUInstance: &gi, PID: 101, MemoryMiB: 2048, Cgroup: cg},
		{GPU: 0, GPUInstance: &gi, PID: 102, MemoryMiB: 1024, Cgroup: cg},
		{GPU: 0, GPUInstance: &gi, PID: 300, MemoryMiB: 512, Cgroup: "0::/system.slice/nvidia-mps.service"},
		{GPU: 0, GPUInstance: &otherGI, PID: 103, MemoryMiB: 100, Cgroup: cg},
	}
	for _, pid := range []uint32{101, 102, 103} {
		u.mount(t, pid, nil)
	}
	if err := os.WriteFile(file, simnode.FormatProcesses(procs), 0o644); err != nil {
		t.Fatal(err)
	}

	const mib = 1 << 20
	series := map[string]string{"namespace": mine.Namespace, "pod": "mig-trainer", "container": "train", "group": "G0", "seat": "6", "gpu": "0", "mig_uuid": migUUID, "placement": "{6}:1"}
	var got float64
	var ok bool
	if err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		got, ok = e.gathered("kyb_container_gpu_memory_used_bytes", series)
		return ok && got == 3072*mib, nil
	}); err != nil {
		t.Fatalf("kyb_container_gpu_memory_used_bytes%v = %v (present %v), want %v", series, got, ok, 3072*mib)
	}
	instance := map[string]string{"gpu": "0", "mig_uuid": migUUID, "placement": "{6}:1"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kyb_container_gpu_processes", series, 2},
		{"kyb_container_gpu_sm_utilization_ratio", series, 0},
		{"kyb_mig_memory_used_bytes", instance, (2048 + 1024 + 512) * mib},
		{"kyb_mig_memory_total_bytes", instance, 9984 * mib},
		{"kyb_mig_memory_used_bytes", map[string]string{"gpu": "0", "placement": "{5}:1"}, 100 * mib},
		{"kyb_gpu_unattributed_memory_used_bytes", map[string]string{"gpu": "0", "reason": "outside-pods"}, 512 * mib},
		{"kyb_gpu_unattributed_memory_used_bytes", map[string]string{"gpu": "0", "reason": "no-seat-here"}, 100 * mib},
	} {
		if got, ok := e.gathered(c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := e.gathered("kyb_container_gpu_memory_used_bytes", map[string]string{"placement": "{5}:1"}); ok {
		t.Error("the container's process in an instance it holds no seat of is given to a seat")
	}
}
