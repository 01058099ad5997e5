package draplugin_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// These tests run the real health monitor on the env's simulated node (on
// a fake clock, so recovery is one clock step) as the plugin's health
// source, and watch what the kubelet and the API server see: the health
// stream over the plugin's socket, the ResourceSlices and the Node's events
// in the fake API server, and the plugin's metrics.

// withMonitor makes a running health monitor the plugin's health source.
func withMonitor(fc *testingclock.FakeClock, mon **health.Monitor) envOption {
	return func(e *env) {
		m, err := health.New(health.Options{NVML: e.sim.NVML(), Inventory: e.inv, Clock: fc, WaitTimeout: 50 * time.Millisecond})
		if err != nil {
			e.t.Fatal(err)
		}
		m.Start(e.ctx)
		e.t.Cleanup(m.Stop)
		*mon = m
		prev := e.opts
		e.opts = func(o *draplugin.Options) {
			if prev != nil {
				prev(o)
			}
			o.Health.Source = m
			o.Health.Collector = m.Collector()
		}
	}
}

// taints lists the published devices that carry a taint, as
// "device key=value:effect".
func taints(t *testing.T, e *env) []string {
	t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			for _, tn := range d.Taints {
				out = append(out, fmt.Sprintf("%s %s=%s:%s", d.Name, tn.Key, tn.Value, tn.Effect))
			}
		}
	}
	slices.Sort(out)
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nodeEvent returns the note of the latest event with a reason on the Node.
func nodeEvent(t *testing.T, e *env, reason string) string {
	t.Helper()
	evs, err := e.client.EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	note := ""
	for _, ev := range evs.Items {
		if ev.Reason == reason && ev.Regarding.Kind == "Node" && ev.Regarding.Name == nodeName {
			note = ev.Note
		}
	}
	return note
}

// unhealthyIn renders a health report's unhealthy devices as
// "device: message".
func unhealthyIn(resp *drahealth.NodeWatchResourcesResponse) []string {
	var out []string
	for _, d := range resp.Devices {
		if d.Health != drahealth.HealthStatus_HEALTHY {
			out = append(out, fmt.Sprintf("%s %s: %s", d.Device.DeviceName, d.Health, d.Message))
		}
	}
	slices.Sort(out)
	return out
}

// streamUntil reads health reports until one has exactly the wanted
// unhealthy devices.
func streamUntil(t *testing.T, stream drahealth.DRAResourceHealth_NodeWatchResourcesClient, want []string) {
	t.Helper()
	var got []string
	for i := 0; i < 200; i++ {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if got = unhealthyIn(resp); slices.Equal(got, want) {
			return
		}
	}
	t.Fatalf("health stream: unhealthy %q, want %q", got, want)
}

func healthEvents(t *testing.T, e *env, gpu, kind string) float64 {
	t.Helper()
	mfs, err := e.driver.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kyb_gpu_health_events_total" {
			continue
		}
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["gpu"] == gpu && labels["kind"] == kind {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no kyb_gpu_health_events_total{gpu=%q,kind=%q} in the plugin's registry", gpu, kind)
	return 0
}

func TestGPUFaultTaintsItsGroupsAndRecoversOverSockets(t *testing.T) {
	fc := testingclock.NewFakeClock(time.Now())
	var mon *health.Monitor
	e := newEnv(t, "nvlink-2x4", seed, withMonitor(fc, &mon))
	stream, err := drahealth.NewDRAResourceHealthClient(e.conn).NodeWatchResources(e.ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	streamUntil(t, stream, nil)
	if got := taints(t, e); len(got) != 0 {
		t.Fatalf("healthy node publishes taints %q", got)
	}

	if err := e.sim.Inject(simnode.Event{GPU: 2, Type: nvml.EventTypeXidCriticalError, Data: 79}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"g2-1x gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
		"g23-2x gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
	}
	waitFor(t, "the taints of GPU 2's groups", func() bool { return slices.Equal(taints(t, e), want) })
	streamUntil(t, stream, []string{
		"g2-1x UNHEALTHY: GPU 2: XID 79 (GPU has fallen off the bus)",
		"g23-2x UNHEALTHY: GPU 2: XID 79 (GPU has fallen off the bus)",
	})
	waitFor(t, "a GPUUnhealthy event", func() bool { return nodeEvent(t, e, "GPUUnhealthy") != "" })
	if got, want := nodeEvent(t, e, "GPUUnhealthy"), fmt.Sprintf("GPU 2 (%s) is unhealthy: XID 79 (GPU has fallen off the bus). Its groups G2 G23 are tainted gpu.kyb.ai/unhealthy=xid-79:NoSchedule", e.inv.GPUs[2].UUID); got != want {
		t.Errorf("event:\n got %q\nwant %q", got, want)
	}
	if n := healthEvents(t, e, "2", "xid"); n != 1 {
		t.Errorf("kyb_gpu_health_events_total{gpu=2,kind=xid} = %v, want 1", n)
	}

	// The monitor's probes succeed; its clock stepped past the recovery
	// period makes GPU 2 healthy again. The clock may have other waiters
	// than the probe ticker (the event loop's backoff), so it is stepped
	// until the probe that sees the quiet period has run.
	waitFor(t, "the taints to go", func() bool {
		if len(taints(t, e)) == 0 {
			return true
		}
		if fc.HasWaiters() {
			fc.Step(mon.RecoveryPeriod())
		}
		return false
	})
	streamUntil(t, stream, nil)
	waitFor(t, "a GPUHealthy event", func() bool { return nodeEvent(t, e, "GPUHealthy") != "" })
	if got, want := nodeEvent(t, e, "GPUHealthy"), fmt.Sprintf("GPU 2 (%s) is healthy again after xid-79; the taint is removed from its groups G2 G23", e.inv.GPUs[2].UUID); got != want {
		t.Errorf("event:\n got %q\nwant %q", got, want)
	}
	if n := healthEvents(t, e, "2", "recovered"); n != 1 {
		t.Errorf("kyb_gpu_health_events_total{gpu=2,kind=recovered} = %v, want 1", n)
	}
}

func TestLostGPUTaintsWithTheConfiguredEffect(t *testing.T) {
	fc := testingclock.NewFakeClock(time.Now())
	var mon *health.Monitor
	e := newEnv(t, "nvlink-2x4", seed,
		withOptions(func(o *draplugin.Options) { o.Health.LostEffect = resourceapi.DeviceTaintEffectNoExecute }),
		withMonitor(fc, &mon))
	if err := e.sim.Apply(simnode.Fault{Op: "lost", GPU: 5}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"g45-2x gpu.kyb.ai/unhealthy=gpu-lost:NoExecute",
		"g5-1x gpu.kyb.ai/unhealthy=gpu-lost:NoExecute",
	}
	waitFor(t, "the NoExecute taints of GPU 5's groups", func() bool { return slices.Equal(taints(t, e), want) })
	// Events are sent in the background: the taint may land first.
	waitFor(t, "the GPUUnhealthy event", func() bool { return nodeEvent(t, e, "GPUUnhealthy") != "" })
	if note := nodeEvent(t, e, "GPUUnhealthy"); !strings.Contains(note, "stays unhealthy until it is reset and the plugin restarted") {
		t.Errorf("event %q", note)
	}
}

// dropTaints makes the fake API server behave like one with DRADeviceTaints
// off: it silently drops device taints on write.
func dropTaints(c *fake.Clientset) {
	drop := func(action k8stesting.Action) (bool, runtime.Object, error) {
		// Creates and updates both carry the object written.
		var obj runtime.Object
		if a, ok := action.(interface{ GetObject() runtime.Object }); ok {
			obj = a.GetObject()
		}
		if slice, ok := obj.(*resourceapi.ResourceSlice); ok {
			for i := range slice.Spec.Devices {
				slice.Spec.Devices[i].Taints = nil
			}
		}
		return false, nil, nil
	}
	c.PrependReactor("create", "resourceslices", drop)
	c.PrependReactor("update", "resourceslices", drop)
}

func TestDroppedTaintsKeepTheLayoutAndTheHealthStream(t *testing.T) {
	fc := testingclock.NewFakeClock(time.Now())
	var mon *health.Monitor
	e := newEnv(t, "nvlink-2x4", seed, withClient(dropTaints), withMonitor(fc, &mon))
	stream, err := drahealth.NewDRAResourceHealthClient(e.conn).NodeWatchResources(e.ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.sim.Inject(simnode.Event{GPU: 6, Type: nvml.EventTypeDoubleBitEccError}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a DeviceTaintsDropped event", func() bool { return nodeEvent(t, e, "DeviceTaintsDropped") != "" })
	streamUntil(t, stream, []string{
		"g6-1x UNHEALTHY: GPU 6: double-bit (uncorrectable) ECC error",
		"g67-2x UNHEALTHY: GPU 6: double-bit (uncorrectable) ECC error",
	})
	if l := e.driver.Layout(); l != draresources.LayoutShared {
		t.Errorf("layout %s after dropped taints, want shared", l)
	}
	if note := nodeEvent(t, e, "SeatLayoutFallback"); note != "" {
		t.Errorf("dropped taints made the plugin fall back: %q", note)
	}
}
