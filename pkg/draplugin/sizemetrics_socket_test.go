package draplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// both applies two options that each set the plugin's options, keeping
// what each sets.
func both(a, b envOption) envOption {
	return func(e *env) {
		a(e)
		first := e.opts
		b(e)
		second := e.opts
		e.opts = func(o *draplugin.Options) { first(o); second(o) }
	}
}

// kyb_seat_memory_bytes and kyb_seat_compute_ratio tell, per sized group,
// how much of its memory (per GPU) and SMs the prepared claims hold and
// how much is free; they sum to what the group publishes (80 GiB, 1).
func TestSizedSeatMetricsOverSockets(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", sizedConfig, withSharing(mpstest.Root(t), mpstest.Build(t)))
	small := e.claim(classSized, sized("16Gi", "30"))
	big := e.claim(classSized, sized("40Gi", "10"))
	pair := e.claim(classSized2x, sized("30Gi", "50"))
	e.prepareOK(small)
	e.prepareOK(big)
	e.prepareOK(pair)
	const gi = float64(1 << 30)
	check := func(when string, want map[string][2]float64) {
		t.Helper()
		for group, w := range want {
			for state, want := range map[string]float64{"held": w[0], "free": 80 - w[0], "blocked": 0, "unhealthy": 0} {
				labels := map[string]string{"group": group, "state": state}
				if got := e.metric("kyb_seat_memory_bytes", labels); got != want*gi {
					t.Errorf("%s: kyb_seat_memory_bytes%v = %v GiB, want %v", when, labels, got/gi, want)
				}
			}
			for _, state := range []string{"blocked", "unhealthy"} {
				labels := map[string]string{"group": group, "state": state}
				if got := e.metric("kyb_seat_compute_ratio", labels); got != 0 {
					t.Errorf("%s: kyb_seat_compute_ratio%v = %v, want 0", when, labels, got)
				}
			}
			held := e.metric("kyb_seat_compute_ratio", map[string]string{"group": group, "state": "held"})
			free := e.metric("kyb_seat_compute_ratio", map[string]string{"group": group, "state": "free"})
			if held != w[1] || free != 1-w[1] {
				t.Errorf("%s: %s's compute held %v, free %v; want %v held", when, group, held, free, w[1])
			}
		}
	}
	// {memory held in GiB, compute held}
	check("three claims prepared", map[string][2]float64{"G0": {56, 0.4}, "G1": {0, 0}, "G45": {30, 0.5}, "G67": {0, 0}})
	if _, ok := e.gathered("kyb_seat_memory_bytes", map[string]string{"profile": "1x-sized", "group": "G0"}); !ok {
		t.Error("no series labelled with the profile's name")
	}
	e.unprepare(big)
	check("the 40Gi claim released", map[string][2]float64{"G0": {16, 0.3}, "G45": {30, 0.5}})
	e.unprepare(small, pair)
	check("all released", map[string][2]float64{"G0": {0, 0}, "G45": {0, 0}})
}

// A sized seat's container is served its size beside its use: the memory
// its claim consumed and its share of the SMs, labelled as its use is, so
// that a panel can divide one by the other.
func TestPerPodGPUUsageShowsASizedSeatsSizeOverSockets(t *testing.T) {
	var e *env
	var u usageNode
	file := filepath.Join(t.TempDir(), "processes")
	e = newEnv(t, "nvlink-2x4", sizedConfig, func(x *env) {
		e = x
		both(withSharing(mpstest.Root(t), mpstest.Build(t)), withUsage(x, file, &u))(x)
	})
	c := e.claim(classSized, sized("16Gi", "30"))
	env, _ := e.container(e.prepareOK(c)...)
	const uid, id = "cccccccc-0000-4000-8000-00000000000c", "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	u.run(t, uid, c.Namespace, "infer", "serve", id, c)
	u.mount(t, 401, nil)
	procs := []simnode.Process{{GPU: 0, PID: 401, MemoryMiB: 6144, SMPercent: 20,
		Cgroup: "0::/kubepods/besteffort/pod" + uid + "/" + id}}
	if err := os.WriteFile(file, simnode.FormatProcesses(procs), 0o644); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"namespace": c.Namespace, "pod": "infer", "container": "serve", "group": env["KYB_GPU_GROUP"], "seat": env["KYB_GPU_SEAT"], "gpu": "0"}
	if err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		v, ok := e.gathered("kyb_container_gpu_memory_used_bytes", labels)
		return ok && v == 6144<<20, nil
	}); err != nil {
		t.Fatalf("no use of %v sampled", labels)
	}
	for name, want := range map[string]float64{
		"kyb_container_gpu_memory_size_bytes":    16 << 30,
		"kyb_container_gpu_compute_size_ratio":   0.3,
		"kyb_container_gpu_sm_utilization_ratio": 0.2,
	} {
		if got, ok := e.gathered(name, labels); !ok || got != want {
			t.Errorf("%s%v = %v (present %v), want %v", name, labels, got, ok, want)
		}
	}
	if env["KYB_GPU_GROUP"] != "G0" || env["CUDA_VISIBLE_DEVICES"] != e.uuids(0) || env["KYB_SEAT_MEMORY"] != "17179869184" {
		t.Errorf("the seat is not 16Gi on GPU 0: %v", env)
	}
}
