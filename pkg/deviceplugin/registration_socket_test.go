package deviceplugin

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

var defaultResources = []string{"kyb.ai/gpu-1x-seat", "kyb.ai/gpu-2x-seat", "kyb.ai/gpu-4x-seat"}

func TestRegistrationHandshakeOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	e.start()
	reqs := e.kubelet.registrations()
	slices.SortFunc(reqs, func(a, b *pluginapi.RegisterRequest) int {
		if a.ResourceName < b.ResourceName {
			return -1
		}
		return 1
	})
	want := []struct{ resource, endpoint string }{
		{"kyb.ai/gpu-1x-seat", "kyb-gpu-1x-seat.sock"},
		{"kyb.ai/gpu-2x-seat", "kyb-gpu-2x-seat.sock"},
		{"kyb.ai/gpu-4x-seat", "kyb-gpu-4x-seat.sock"},
	}
	if len(reqs) != len(want) {
		t.Fatalf("%d registrations, want %d: %v", len(reqs), len(want), reqs)
	}
	for i, w := range want {
		r := reqs[i]
		t.Logf("RegisterRequest %d: version=%s endpoint=%s resourceName=%s options={preStartRequired:%v getPreferredAllocationAvailable:%v}",
			i, r.Version, r.Endpoint, r.ResourceName, r.Options.GetPreStartRequired(), r.Options.GetGetPreferredAllocationAvailable())
		if r.Version != "v1beta1" || r.ResourceName != w.resource || r.Endpoint != w.endpoint {
			t.Errorf("registration %d: %+v, want v1beta1 %s on %s", i, r, w.resource, w.endpoint)
		}
		if !r.Options.GetGetPreferredAllocationAvailable() || r.Options.GetPreStartRequired() {
			t.Errorf("%s registered with options %+v, want GetPreferredAllocationAvailable only", r.ResourceName, r.Options)
		}
		// The kubelet reads the options at registration; the plugin must
		// report the same when asked.
		e.kubelet.mu.Lock()
		got := e.kubelet.options[w.resource]
		e.kubelet.mu.Unlock()
		if got.GetGetPreferredAllocationAvailable() != r.Options.GetGetPreferredAllocationAvailable() || got.GetPreStartRequired() != r.Options.GetPreStartRequired() {
			t.Errorf("%s: GetDevicePluginOptions says %+v, registration said %+v", w.resource, got, r.Options)
		}
		if _, err := os.Stat(filepath.Join(e.dir, w.endpoint)); err != nil {
			t.Errorf("socket of %s: %v", w.resource, err)
		}
	}
}

func TestReRegistersWhenTheKubeletRestartsOverRealSockets(t *testing.T) {
	for _, tc := range []struct {
		name string
		// wipe: the kubelet removes every socket in the directory when it
		// starts, as the real one does; without, only kubelet.sock is
		// re-created.
		wipe bool
	}{{"kubelet socket re-created", false}, {"directory wiped as a starting kubelet does", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "dgx-h100", "")
			e.start()
			for round := 2; round <= 3; round++ {
				e.kubelet.restart(tc.wipe)
				eventually(t, "registration after a kubelet restart", func() bool { return e.kubelet.connected() == 3 })
				for _, r := range defaultResources {
					if _, err := os.Stat(filepath.Join(e.dir, SocketName(r))); err != nil {
						t.Fatalf("round %d: socket of %s: %v", round, r, err)
					}
				}
			}
			// No registration beyond one per resource and restart (one more
			// where a restart cut a registration short).
			time.Sleep(3 * settleDelay)
			if got := e.kubelet.registered(); len(got) < 9 || len(got) > 10 {
				t.Errorf("registrations %v, want each of %v three times", got, defaultResources)
			}
			// The new kubelet can use what it registered.
			resp, err := e.kubelet.client("kyb.ai/gpu-1x-seat").Allocate(e.ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"g6-1x-seat-0"}}}})
			if err != nil || resp.ContainerResponses[0].Envs["KYB_GPU_GROUP"] != "G6" {
				t.Errorf("Allocate after restart: %v %v", resp, err)
			}
		})
	}
}

func TestBurstOfKubeletRestartsRegistersOnceOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	e.start()
	for i := 0; i < 5; i++ {
		e.kubelet.restart(true)
		time.Sleep(20 * time.Millisecond)
	}
	eventually(t, "registration after the burst", func() bool { return e.kubelet.connected() == 3 })
	time.Sleep(4 * settleDelay)
	// The events of the burst settle into one round of registrations
	// (3 at start, 3 after). A slow machine may split the burst in two;
	// one round per restart would be 18.
	if n := len(e.kubelet.registrations()); n > 9 {
		t.Errorf("%d registrations after a burst of 5 restarts; want the burst to settle into one round (6), at most two (9)", n)
	}
	for _, r := range defaultResources {
		if _, err := os.Stat(filepath.Join(e.dir, SocketName(r))); err != nil {
			t.Errorf("socket of %s: %v", r, err)
		}
	}
}

func TestRegistersWhenKubeletSocketAppearsLaterOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	e.startPlugin()
	time.Sleep(2 * settleDelay)
	if n := len(e.kubelet.registrations()); n != 0 {
		t.Fatalf("%d registrations without a kubelet", n)
	}
	e.kubelet.start()
	e.waitRegistered(3)
	if got := e.kubelet.registered(); !slices.Equal(got, defaultResources) {
		t.Errorf("registered %v, want %v", got, defaultResources)
	}
}

func TestReRegistersByPollingWithoutFileEventsOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	e.start(func(o *Options) { o.noWatch, o.PollInterval = true, 50*time.Millisecond })
	e.kubelet.restart(true)
	eventually(t, "registration found by polling", func() bool { return e.kubelet.connected() == 3 })
	if n := len(e.kubelet.registrations()); n < 6 {
		t.Errorf("%d registrations, want 3 at start and 3 after the restart", n)
	}
}

func TestStaleSocketRemovedAtStartOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	// Left by a crashed shim: a socket of a resource the shim still serves,
	// and one of a profile the configuration no longer has.
	sockettest.Stale(t, filepath.Join(e.dir, "kyb-gpu-1x-seat.sock"))
	sockettest.Stale(t, filepath.Join(e.dir, "kyb-gpu-8x-seat.sock"))
	// Not ours: left alone.
	sockettest.Stale(t, filepath.Join(e.dir, "nvidia-gpu.sock"))
	e.start()
	if _, err := os.Stat(filepath.Join(e.dir, "kyb-gpu-8x-seat.sock")); !os.IsNotExist(err) {
		t.Errorf("stale socket kyb-gpu-8x-seat.sock: %v, want it removed", err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "nvidia-gpu.sock")); err != nil {
		t.Errorf("another plugin's socket: %v, want it left alone", err)
	}
	// The 1x socket is served again, not stale: the kubelet can call it.
	if _, err := dial(t, filepath.Join(e.dir, "kyb-gpu-1x-seat.sock")).GetDevicePluginOptions(e.ctx, &pluginapi.Empty{}); err != nil {
		t.Errorf("1x socket: %v", err)
	}
}

func TestStopRemovesSocketsAndEndsStreamsOverRealSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	e.start()
	stream, err := dial(t, filepath.Join(e.dir, "kyb-gpu-2x-seat.sock")).ListAndWatch(e.ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	e.plugin.Stop()
	if _, err := stream.Recv(); err == nil {
		t.Error("ListAndWatch goes on after Stop")
	}
	for _, r := range defaultResources {
		if _, err := os.Stat(filepath.Join(e.dir, SocketName(r))); !os.IsNotExist(err) {
			t.Errorf("socket of %s after Stop: %v", r, err)
		}
	}
	if _, err := os.Stat(e.kubelet.sock); err != nil {
		t.Errorf("kubelet.sock after Stop: %v; the shim must not touch it", err)
	}
}

func TestReRegistersAResourceTheKubeletStoppedWatchingOverRealSockets(t *testing.T) {
	// The kubelet ignores a registration for a resource it still holds a
	// client for, and drops the client only when its stream ends; a
	// registration can thus be lost. The shim registers a resource nobody
	// watches again.
	e := newEnv(t, "dgx-h100", "")
	e.start(func(o *Options) { o.PollInterval = 100 * time.Millisecond })
	e.kubelet.drop("kyb.ai/gpu-2x-seat")
	eventually(t, "the 2x resource registered again", func() bool { return e.kubelet.connected() == 3 })
	var twoX int
	for _, r := range e.kubelet.registered() {
		if r == "kyb.ai/gpu-2x-seat" {
			twoX++
		}
	}
	if got := len(e.kubelet.registrations()); twoX != 2 || got != 4 {
		t.Errorf("%d registrations, 2x %d times; want 4 and 2 (only the dropped resource again)", got, twoX)
	}
}
