package deviceplugin

import (
	"fmt"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// render writes a device list as "ID:health:numa ..." for comparison.
func render(devices []*pluginapi.Device) string {
	parts := make([]string, len(devices))
	for i, d := range devices {
		numa := "-"
		if d.Topology != nil {
			var ids []string
			for _, n := range d.Topology.Nodes {
				ids = append(ids, fmt.Sprint(n.ID))
			}
			numa = strings.Join(ids, ",")
		}
		parts[i] = d.ID + ":" + d.Health + ":" + numa
	}
	return strings.Join(parts, " ")
}

const seatsConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
- {resource: kyb.ai/gpu-4x-seat, seatsPerGroup: 2}
`

func TestListAndWatchSendsEverySeatHealthyWithNUMAOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", seatsConfig)
	e.start()
	// dgx-h100: GPUs 0-3 on NUMA node 0, 4-7 on node 1. The exclusive
	// layout gives 4x G0123, 2x G45, 1x G6 and G7.
	want := map[string]string{
		"kyb.ai/gpu-1x-seat": "g6-1x-seat-0:Healthy:1 g6-1x-seat-1:Healthy:1 g7-1x-seat-0:Healthy:1 g7-1x-seat-1:Healthy:1",
		"kyb.ai/gpu-2x-seat": "g45-2x-seat-0:Healthy:1 g45-2x-seat-1:Healthy:1 g45-2x-seat-2:Healthy:1",
		"kyb.ai/gpu-4x-seat": "g0123-4x-seat-0:Healthy:0 g0123-4x-seat-1:Healthy:0",
	}
	for resource, w := range want {
		lists := e.kubelet.listsOf(resource)
		if len(lists) != 1 {
			t.Errorf("%s: %d lists, want 1", resource, len(lists))
			continue
		}
		if got := render(lists[0]); got != w {
			t.Errorf("%s:\n got %s\nwant %s", resource, got, w)
		}
	}
}

func TestListAndWatchGroupSpanningSocketsHasNoNUMAOverRealSockets(t *testing.T) {
	// An explicit 2x group of GPUs 3 and 4 spans both NUMA nodes.
	e := newEnv(t, "dgx-h100", `
profiles:
- {resource: kyb.ai/gpu-2x-seat, gpus: [3, 4]}
grouping: explicit
groups:
- {name: G34, gpus: [3, 4]}
`)
	e.start()
	if got, want := render(e.kubelet.listsOf("kyb.ai/gpu-2x-seat")[0]), "g34-2x-seat-0:Healthy:-"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestListAndWatchResendsOnHealthChangeOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", seatsConfig)
	health := newFakeHealth()
	e.start(func(o *Options) { o.Health = health })

	// GPU 5 fails: every seat of G45 goes, the 1x seats stay.
	health.set(5, "XID 79: fallen off the bus")
	const twoX = "kyb.ai/gpu-2x-seat"
	eventually(t, "a second 2x list", func() bool { return len(e.kubelet.listsOf(twoX)) == 2 })
	if got, want := render(e.kubelet.listsOf(twoX)[1]), "g45-2x-seat-0:Unhealthy:1 g45-2x-seat-1:Unhealthy:1 g45-2x-seat-2:Unhealthy:1"; got != want {
		t.Errorf("after GPU 5 failed:\n got %s\nwant %s", got, want)
	}

	// GPU 6 fails: the 1x resource re-sends its full list.
	health.set(6, "XID 48: double-bit ECC error")
	const oneX = "kyb.ai/gpu-1x-seat"
	eventually(t, "a second 1x list", func() bool { return len(e.kubelet.listsOf(oneX)) == 2 })
	if got, want := render(e.kubelet.listsOf(oneX)[1]), "g6-1x-seat-0:Unhealthy:1 g6-1x-seat-1:Unhealthy:1 g7-1x-seat-0:Healthy:1 g7-1x-seat-1:Healthy:1"; got != want {
		t.Errorf("after GPU 6 failed:\n got %s\nwant %s", got, want)
	}

	// GPU 5 recovers.
	health.set(5, "")
	eventually(t, "a third 2x list", func() bool { return len(e.kubelet.listsOf(twoX)) == 3 })
	if got, want := render(e.kubelet.listsOf(twoX)[2]), "g45-2x-seat-0:Healthy:1 g45-2x-seat-1:Healthy:1 g45-2x-seat-2:Healthy:1"; got != want {
		t.Errorf("after GPU 5 recovered:\n got %s\nwant %s", got, want)
	}
	// The 4x group never changed: no list was sent again for it.
	if n := len(e.kubelet.listsOf("kyb.ai/gpu-4x-seat")); n != 1 {
		t.Errorf("4x: %d lists, want 1 (its health never changed)", n)
	}
}

// The real health monitor on the simulated node: faults go through the
// simulated NVML event set, recovery is one step of the monitor's fake
// clock.
func TestListAndWatchFollowsTheHealthMonitorOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", seatsConfig)
	fc := testingclock.NewFakeClock(time.Now())
	mon, err := health.New(health.Options{NVML: e.sim.NVML(), Inventory: e.inv, Clock: fc, WaitTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mon.Start(e.ctx)
	t.Cleanup(mon.Stop)
	e.start(func(o *Options) { o.Health = mon })

	const twoX, oneX = "kyb.ai/gpu-2x-seat", "kyb.ai/gpu-1x-seat"
	if err := e.sim.Apply(simnode.Fault{Op: "xid", GPU: 5, XID: 79}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a second 2x list", func() bool { return len(e.kubelet.listsOf(twoX)) == 2 })
	if got, want := render(e.kubelet.listsOf(twoX)[1]), "g45-2x-seat-0:Unhealthy:1 g45-2x-seat-1:Unhealthy:1 g45-2x-seat-2:Unhealthy:1"; got != want {
		t.Errorf("after XID 79 on GPU 5:\n got %s\nwant %s", got, want)
	}
	if err := e.sim.Apply(simnode.Fault{Op: "lost", GPU: 6}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a second 1x list", func() bool { return len(e.kubelet.listsOf(oneX)) == 2 })
	if got, want := render(e.kubelet.listsOf(oneX)[1]), "g6-1x-seat-0:Unhealthy:1 g6-1x-seat-1:Unhealthy:1 g7-1x-seat-0:Healthy:1 g7-1x-seat-1:Healthy:1"; got != want {
		t.Errorf("after GPU 6 was lost:\n got %s\nwant %s", got, want)
	}

	// A quiet recovery period later GPU 5 is healthy again; GPU 6 is lost
	// for good, so the 1x resource sends nothing new.
	eventually(t, "the monitor's probe loop", fc.HasWaiters)
	fc.Step(mon.RecoveryPeriod())
	eventually(t, "a third 2x list", func() bool { return len(e.kubelet.listsOf(twoX)) == 3 })
	if got, want := render(e.kubelet.listsOf(twoX)[2]), "g45-2x-seat-0:Healthy:1 g45-2x-seat-1:Healthy:1 g45-2x-seat-2:Healthy:1"; got != want {
		t.Errorf("after GPU 5 recovered:\n got %s\nwant %s", got, want)
	}
	if n := len(e.kubelet.listsOf(oneX)); n != 2 {
		t.Errorf("1x: %d lists, want 2 (a lost GPU does not recover)", n)
	}
}
