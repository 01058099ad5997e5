package health

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// rig is a monitor on a simulated 8-GPU node with a fake clock. It drives
// the monitor's steps itself (no goroutines): faults go through the
// simulated NVML event set and the monitor handles what Wait hands out, and
// probes run when the test says, so every timing is exact.
type rig struct {
	t   *testing.T
	ctx context.Context
	sim *simnode.Node
	fc  *testingclock.FakeClock
	m   *Monitor
	set nvml.EventSet
}

func newRig(t *testing.T, cfg *v1alpha1.HealthConfig) *rig {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	sim, inv := simnodetest.Inventory(t, "dgx-h100", "node-1")
	fc := testingclock.NewFakeClock(t0)
	m, err := New(Options{NVML: sim.NVML(), Inventory: inv, Config: cfg, Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	set, err := m.openEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			t.Errorf("free the event set: %v", ret)
		}
	})
	return &rig{t: t, ctx: ctx, sim: sim, fc: fc, m: m, set: set}
}

// do runs one step at t0+at: a line of the fault-injection file (xid,
// ecc, lost, recover, action), "fail GPU" (NVML calls on the GPU answer
// ERROR_UNKNOWN), "set-action GPU ACTION" (the driver's recovery action
// changes, without an event yet), "no-action-field GPU" (the GPU's driver
// does not report recovery actions), or "probe" (every GPU is probed, as
// at a tick of the probe loop).
func (r *rig) do(at time.Duration, step string) {
	r.t.Helper()
	r.fc.SetTime(t0.Add(at))
	var gpu int
	var name string
	switch {
	case step == "probe":
		r.m.probeAll(r.ctx)
	case strings.HasPrefix(step, "set-action "):
		if _, err := fmt.Sscanf(step, "set-action %d %s", &gpu, &name); err != nil {
			r.t.Fatalf("step %q: %v", step, err)
		}
		a, err := simnode.ParseRecoveryAction(name)
		if err == nil {
			err = r.sim.SetRecoveryAction(gpu, a)
		}
		if err != nil {
			r.t.Fatal(err)
		}
	case strings.HasPrefix(step, "no-action-field "):
		if _, err := fmt.Sscanf(step, "no-action-field %d", &gpu); err != nil {
			r.t.Fatalf("step %q: %v", step, err)
		}
		if err := r.sim.SetRecoveryActionSupported(gpu, false); err != nil {
			r.t.Fatal(err)
		}
	case strings.HasPrefix(step, "fail "):
		if _, err := fmt.Sscanf(step, "fail %d", &gpu); err != nil {
			r.t.Fatalf("step %q: %v", step, err)
		}
		if err := r.sim.SetError(gpu, nvml.ERROR_UNKNOWN); err != nil {
			r.t.Fatal(err)
		}
	default:
		f, err := simnode.ParseFault(step)
		if err != nil {
			r.t.Fatal(err)
		}
		if err := r.sim.Apply(f); err != nil {
			r.t.Fatal(err)
		}
		if f.Op != "recover" {
			ev, ret := r.set.Wait(1000)
			if ret != nvml.SUCCESS {
				r.t.Fatalf("%s: no event from the simulated NVML: %v", step, ret)
			}
			r.m.handleEvent(r.ctx, ev)
		}
	}
}

// faults renders the unhealthy GPUs as "gpu:reason" in GPU order.
func (r *rig) faults() string {
	var out []string
	for gpu, f := range r.m.Faults() {
		out = append(out, fmt.Sprintf("%d:%s", gpu, f.Reason))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

type step struct {
	at   time.Duration
	do   string
	want string // the unhealthy GPUs after the step
}

func TestRecoveryTiming(t *testing.T) {
	tests := []struct {
		name  string
		cfg   *v1alpha1.HealthConfig
		steps []step
	}{
		{
			name: "a critical XID makes the GPU unhealthy until the default recovery period passes without faults",
			steps: []step{
				{0, "xid 2 79", "2:xid-79"},
				{4*time.Minute + 59*time.Second, "probe", "2:xid-79"},
				{5 * time.Minute, "probe", ""},
			},
		},
		{
			name: "recovery needs a successful probe after the period, not just time",
			cfg:  &v1alpha1.HealthConfig{RecoveryPeriod: &metav1.Duration{Duration: 2 * time.Second}},
			steps: []step{
				{0, "ecc 5", "5:double-bit-ecc"},
				{10 * time.Second, "xid 6 13", "5:double-bit-ecc"}, // an ignored XID elsewhere changes nothing
				{11 * time.Second, "probe", ""},
			},
		},
		{
			name: "a new event during the period restarts the clock and keeps the first cause",
			steps: []step{
				{0, "xid 2 79", "2:xid-79"},
				{3 * time.Minute, "xid 2 48", "2:xid-79"},
				{5 * time.Minute, "probe", "2:xid-79"},
				{7*time.Minute + 59*time.Second, "probe", "2:xid-79"},
				{8 * time.Minute, "probe", ""},
			},
		},
		{
			name: "an ignored XID during the period does not restart the clock",
			steps: []step{
				{0, "xid 2 79", "2:xid-79"},
				{3 * time.Minute, "xid 2 31", "2:xid-79"},
				{5 * time.Minute, "probe", ""},
			},
		},
		{
			name: "a failing probe during the period keeps the GPU unhealthy and restarts the clock",
			steps: []step{
				{0, "xid 1 79", "1:xid-79"},
				{4 * time.Minute, "fail 1", "1:xid-79"},
				{4 * time.Minute, "probe", "1:xid-79"},
				{4*time.Minute + 10*time.Second, "recover 1", "1:xid-79"},
				{5 * time.Minute, "probe", "1:xid-79"},
				{9 * time.Minute, "probe", ""},
			},
		},
		{
			name: "a GPU that NVML cannot reach is unhealthy without an event, and recovers",
			steps: []step{
				{0, "fail 3", ""},
				{time.Second, "probe", "3:unreachable"},
				{2 * time.Second, "recover 3", "3:unreachable"},
				{5*time.Minute + time.Second, "probe", ""},
			},
		},
		{
			name: "a lost GPU never recovers, even when NVML answers again",
			steps: []step{
				{0, "lost 4", "4:gpu-lost"},
				{time.Second, "recover 4", "4:gpu-lost"},
				{time.Hour, "probe", "4:gpu-lost"},
			},
		},
		{
			name: "a GPU found lost by a probe replaces an XID fault and never recovers",
			steps: []step{
				{0, "xid 7 79", "7:xid-79"},
				{time.Second, "fail 7", "7:xid-79"},
				{2 * time.Second, "lost 7", "7:gpu-lost"},
				{time.Hour, "probe", "7:gpu-lost"},
			},
		},
		{
			name: "one GPU's faults leave the others alone",
			steps: []step{
				{0, "xid 0 79", "0:xid-79"},
				{time.Minute, "ecc 3", "0:xid-79 3:double-bit-ecc"},
				{5 * time.Minute, "probe", "3:double-bit-ecc"},
				{6 * time.Minute, "probe", ""},
			},
		},
		{
			name: "criticalXIDs make an application XID count",
			cfg:  &v1alpha1.HealthConfig{CriticalXIDs: []int{13}},
			steps: []step{
				{0, "xid 0 13", "0:xid-13"},
			},
		},
		{
			name: "ignoredXIDs make a critical XID harmless",
			cfg:  &v1alpha1.HealthConfig{IgnoredXIDs: []int{79}},
			steps: []step{
				{0, "xid 0 79", ""},
				{time.Second, "probe", ""},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.cfg)
			for _, s := range tt.steps {
				r.do(s.at, s.do)
				if got := r.faults(); got != s.want {
					t.Fatalf("after %q at +%v: unhealthy %q, want %q", s.do, s.at, got, s.want)
				}
			}
		})
	}
}

func TestFaultMessagesSayWhatHappened(t *testing.T) {
	r := newRig(t, nil)
	r.do(0, "xid 2 79")
	r.do(0, "ecc 3")
	r.do(0, "lost 4")
	r.do(0, "fail 5")
	r.do(0, "probe")
	want := map[int]string{
		2: "XID 79 (GPU has fallen off the bus)",
		3: "double-bit (uncorrectable) ECC error",
		4: "GPU unavailable (NVML event)",
		5: "NVML GetUUID: Unknown Error",
	}
	got := messages(r.m.Faults())
	if len(got) != len(want) {
		t.Errorf("unhealthy %v, want %v", got, want)
	}
	for gpu, msg := range want {
		if got[gpu] != msg {
			t.Errorf("GPU %d: %q, want %q", gpu, got[gpu], msg)
		}
	}
	if f := r.m.Faults()[2]; f.Kind != KindXID || f.XID != 79 || !f.Since.Equal(t0) {
		t.Errorf("GPU 2 fault %+v", f)
	}
}

// failingWait is an event set whose Wait fails, as NVML's does after some
// driver hiccups.
type failingWait struct {
	nvml.EventSet
	waits chan struct{}
}

func (f *failingWait) Wait(uint32) (nvml.EventData, nvml.Return) {
	select {
	case f.waits <- struct{}{}:
	default:
	}
	return nvml.EventData{}, nvml.ERROR_UNKNOWN
}

func TestWaitErrorProbesEachGPUInsteadOfMarkingAll(t *testing.T) {
	r := newRig(t, nil)
	if err := r.sim.SetLost(6, true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	set := &failingWait{EventSet: r.set, waits: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.m.watchEvents(ctx, set)
	}()
	<-set.waits
	// The loop probes every GPU, then waits on the clock before it tries
	// again: once it waits, the probes are done.
	deadline := time.Now().Add(10 * time.Second)
	for !r.fc.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the event loop never backed off")
		}
		time.Sleep(time.Millisecond)
	}
	if got, want := r.faults(), "6:gpu-lost"; got != want {
		t.Errorf("unhealthy %q, want %q: only the GPU that does not answer", got, want)
	}
	cancel()
	<-done
}

func TestEventForUnknownDeviceProbesEachGPU(t *testing.T) {
	r := newRig(t, nil)
	if err := r.sim.SetError(1, nvml.ERROR_UNKNOWN); err != nil {
		t.Fatal(err)
	}
	r.m.handleEvent(r.ctx, nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 79})
	if got, want := r.faults(), "1:unreachable"; got != want {
		t.Errorf("unhealthy %q, want %q", got, want)
	}
}

func TestHealthEventsAreCounted(t *testing.T) {
	r := newRig(t, &v1alpha1.HealthConfig{RecoveryPeriod: &metav1.Duration{Duration: time.Minute}})
	r.do(0, "xid 2 79")
	r.do(0, "xid 2 13")
	r.do(0, "xid 2 43")
	r.do(0, "ecc 3")
	r.do(time.Minute, "probe")
	for _, c := range []struct {
		gpu, kind string
		want      float64
	}{
		{"2", "xid", 1}, {"2", "xid_ignored", 2}, {"2", "recovered", 1},
		{"3", "ecc", 1}, {"3", "recovered", 1}, {"0", "xid", 0}, {"7", "lost", 0}, {"7", "recovery_action", 0},
	} {
		if got := testutil.ToFloat64(r.m.metrics.events.WithLabelValues(c.gpu, c.kind)); got != c.want {
			t.Errorf("gpu %s kind %s: %v, want %v", c.gpu, c.kind, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(r.m.Collector()); n != 8*7 {
		t.Errorf("%d series, want 56 (8 GPUs x 7 kinds, zero-initialised)", n)
	}
}

// The running monitor: events arrive through its own goroutines, the probe
// loop runs on the fake clock, and subscribers hear of every change.
func TestMonitorWatchesUntilStopped(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	sim, inv := simnodetest.Inventory(t, "dgx-h100", "node-1")
	fc := testingclock.NewFakeClock(t0)
	m, err := New(Options{NVML: sim.NVML(), Inventory: inv, Clock: fc, WaitTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(ctx)
	changed, unsubscribe := m.Subscribe()
	defer unsubscribe()
	wait := func(what string) {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatalf("no change notification: %s", what)
		}
	}
	if err := sim.Inject(simnode.Event{GPU: 2, Type: nvml.EventTypeXidCriticalError, Data: 74}); err != nil {
		t.Fatal(err)
	}
	wait("GPU 2 unhealthy")
	if got := messages(m.Faults()); len(got) != 1 || got[2] != "XID 74 (NVLink error)" {
		t.Fatalf("unhealthy %v", got)
	}
	// The probe loop's ticker is on the fake clock: once it exists, one
	// step past the recovery period makes it probe at t0+5m.
	for !fc.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	fc.Step(m.RecoveryPeriod())
	wait("GPU 2 healthy again")
	if got := messages(m.Faults()); len(got) != 0 {
		t.Fatalf("unhealthy after the recovery period: %v", got)
	}
	stopped := make(chan struct{})
	go func() {
		m.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return")
	}
	if err := sim.Inject(simnode.Event{GPU: 3, Type: nvml.EventTypeXidCriticalError, Data: 79}); err != nil {
		t.Fatal(err)
	}
	if got := messages(m.Faults()); len(got) != 0 {
		t.Errorf("a stopped monitor changed: %v", got)
	}
}

// messages maps every unhealthy GPU to what is wrong with it.
func messages(faults map[int]Fault) map[int]string {
	out := map[int]string{}
	for gpu, f := range faults {
		out[gpu] = f.Message
	}
	return out
}
