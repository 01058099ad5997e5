package draplugin_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sharedseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// mpsNode is a plugin on nvlink-2x4 whose MPS daemons are the simulated
// nvidia-cuda-mps-control, under a short root.
type mpsNode struct {
	*env
	control, root string
}

// mpsOptions are the plugin's options for MPS daemons under root: a
// Manager of its own, as each plugin process has, with waits and a watch
// interval short enough for a test; mpsOpts, when set, changes the
// Manager's options.
func mpsOptions(t *testing.T, e *env, root, control string, mpsOpts func(*mps.Options), mutate ...func(*draplugin.Options)) func(*draplugin.Options) {
	return func(o *draplugin.Options) {
		host := &gpuhost.Host{NVML: e.sim.NVML(), Simulated: e.sim}
		mo := mps.Options{Root: root, Control: []string{control}, SetExclusive: host.SetExclusive, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB, ControlTimeout: time.Second, StopTimeout: time.Second}
		if mpsOpts != nil {
			mpsOpts(&mo)
		}
		mgr, err := mps.NewManager(mo)
		if err != nil {
			t.Fatal(err)
		}
		o.Sharing = sharedseats.Options{Hardware: &groupshare.Hardware{Inv: e.inv, MPS: mgr, SetTimeSlice: host.SetTimeSlice}, WatchInterval: 50 * time.Millisecond}
		for _, m := range mutate {
			m(o)
		}
	}
}

func newMPSNode(t *testing.T, config string, options ...envOption) *mpsNode {
	t.Helper()
	return newMPSNodeWith(t, config, nil, options...)
}

func newMPSNodeWith(t *testing.T, config string, mpsOpts func(*mps.Options), options ...envOption) *mpsNode {
	t.Helper()
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	opts := append([]envOption{func(e *env) { e.opts = mpsOptions(t, e, root, control, mpsOpts) }}, options...)
	return &mpsNode{env: newEnv(t, "nvlink-2x4", config, opts...), control: control, root: root}
}

// daemons are the PIDs of the simulated daemons of a group.
func (n *mpsNode) daemons(group string) []int {
	n.t.Helper()
	var pids []int
	for pid, pipe := range mpstest.Daemons(n.t, n.control) {
		if pipe == filepath.Join(n.root, group, mps.PipeDir) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

func (n *mpsNode) pipe(group string) string { return filepath.Join(n.root, group, mps.PipeDir) }

// A daemon that dies while a claim holds its group is started again by
// the watcher, with the claim's share; the restart is counted and
// reported on the node.
func TestAnMPSDaemonThatDiesIsStartedAgain(t *testing.T) {
	n := newMPSNode(t, sharingConfig)
	one := n.claim(class1x)
	env, _ := n.container(n.prepareOK(one)...)
	first := n.daemons("g0-1x")
	if len(first) != 1 {
		t.Fatalf("daemons of g0-1x %v, want one", first)
	}
	if err := syscall.Kill(first[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the watcher to start the daemon again", func() bool {
		now := n.daemons("g0-1x")
		return len(now) == 1 && now[0] != first[0]
	})
	// The process is there before it listens; the event is emitted once
	// the restart is confirmed, so a client joins only after it.
	waitFor(t, "the MPSDaemonRestarted event", func() bool { return nodeEvent(t, n.env, "MPSDaemonRestarted") != "" })
	if got := joinMPS(t, n.control, n.pipe("g0-1x"), env); got != "thread=25 mem=0=20480M" {
		t.Errorf("the seat's container got %q from the restarted daemon", got)
	}
	if v := n.metric("kyb_mps_daemon_restarts_total", map[string]string{"group": "g0-1x"}); v != 1 {
		t.Errorf("kyb_mps_daemon_restarts_total{group=g0-1x} = %v, want 1", v)
	}
	if m := n.sim.ComputeMode(0); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 0 is %s under the restarted daemon", simnode.ComputeModeName(m))
	}
	n.unprepare(one)
	if got := n.daemons("g0-1x"); len(got) != 0 {
		t.Errorf("daemons %v after the group's last release", got)
	}
}

// A daemon that dies while a claim holds its group, and whose restarts
// fail for a while (the daemon exits at once): the watcher tries again at
// every check, logs the failure once rather than at each, and starts the
// daemon as soon as a start succeeds; only that restart is counted.
func TestAnMPSDaemonWhoseRestartsFailIsStartedOnceOneCan(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "fail")
	wrapper := filepath.Join(t.TempDir(), "control.sh")
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	n := newMPSNodeWith(t, sharingConfig, func(o *mps.Options) {
		script := "#!/bin/sh\nif [ \"$1\" = -f ] && [ -e " + marker + " ]; then echo transient failure; exit 1; fi\nexec " + o.Control[0] + " \"$@\"\n"
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		o.Control = []string{wrapper}
	}, func(e *env) { e.ctx = klog.NewContext(e.ctx, logger) })
	logs := func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
	one := n.claim(class1x)
	env, _ := n.container(n.prepareOK(one)...)
	first := n.daemons("g0-1x")
	if len(first) != 1 {
		t.Fatalf("daemons of g0-1x %v, want one", first)
	}
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(first[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	daemonOut := filepath.Join(n.root, "g0-1x", mps.LogDir, "daemon.out")
	waitFor(t, "five failed restarts", func() bool {
		data, _ := os.ReadFile(daemonOut)
		return strings.Count(string(data), "transient failure") >= 5
	})
	if got := strings.Count(logs(), "Cannot settle MPS daemon"); got != 1 {
		t.Errorf("the watcher logged %d failures of the group's restarts, want 1 (then at most one a minute)", got)
	}
	if v, ok := n.gathered("kyb_mps_daemon_restarts_total", map[string]string{"group": "g0-1x"}); ok && v != 0 {
		t.Errorf("kyb_mps_daemon_restarts_total{group=g0-1x} = %v after failed restarts only, want 0", v)
	}

	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	// Counted once the daemon answers with its limits.
	waitFor(t, "the watcher to start the daemon once it can, and count it", func() bool {
		v, ok := n.gathered("kyb_mps_daemon_restarts_total", map[string]string{"group": "g0-1x"})
		return ok && v == 1
	})
	if got := n.daemons("g0-1x"); len(got) != 1 {
		t.Errorf("daemons of g0-1x %v after the restart, want one", got)
	}
	if got := joinMPS(t, n.control, n.pipe("g0-1x"), env); got != "thread=25 mem=0=20480M" {
		t.Errorf("the seat's container got %q from the restarted daemon", got)
	}
	if m := n.sim.ComputeMode(0); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 0 is %s under the restarted daemon", simnode.ComputeModeName(m))
	}
	if !strings.Contains(logs(), "MPS daemon settled after failed attempts") {
		t.Error("the watcher did not log that the group's daemon runs again after failed attempts")
	}
}

// fakeHealth is a GPU health source a test sets.
type fakeHealth struct {
	mu     sync.Mutex
	faults map[int]health.Fault
	subs   []chan struct{}
}

func (f *fakeHealth) Faults() map[int]health.Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int]health.Fault{}
	for k, v := range f.faults {
		out[k] = v
	}
	return out
}

func (f *fakeHealth) Subscribe() (<-chan struct{}, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{}, 1)
	f.subs = append(f.subs, ch)
	return ch, func() {}
}

func (f *fakeHealth) set(gpu int, fault *health.Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fault == nil {
		delete(f.faults, gpu)
	} else {
		f.faults[gpu] = *fault
	}
	for _, ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// A lost GPU stops its group's MPS daemon (its clients went with the GPU)
// but keeps the daemon's directories while a claim holds the group: when
// the GPU comes back, the daemon started again listens in the pipe
// directory the claim's containers have mounted. An open descriptor of
// the directory stands in for a container's bind mount.
func TestALostGPUStopsItsMPSDaemonAndKeepsItsPipeDirectory(t *testing.T) {
	src := &fakeHealth{faults: map[int]health.Fault{}}
	n := newMPSNode(t, sharingConfig, func(e *env) {
		prev := e.opts
		e.opts = func(o *draplugin.Options) { prev(o); o.Health.Source = src }
	})
	one := n.claim(class1x)
	env, _ := n.container(n.prepareOK(one)...)
	mounted, err := os.Open(n.pipe("g0-1x"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mounted.Close() }()

	src.set(0, &health.Fault{Kind: health.KindLost, Reason: "gpu-lost", Message: "GPU 0 is lost"})
	waitFor(t, "the daemon of the lost GPU's group to stop", func() bool { return len(n.daemons("g0-1x")) == 0 })
	if _, err := os.Stat(n.pipe("g0-1x")); err != nil {
		t.Errorf("the pipe directory of a group a claim holds: %v", err)
	}
	src.set(0, nil)
	waitFor(t, "the daemon to start again once the GPU is back", func() bool { return len(n.daemons("g0-1x")) == 1 })
	var before, after syscall.Stat_t
	if err := syscall.Fstat(int(mounted.Fd()), &before); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(n.pipe("g0-1x"), &after); err != nil {
		t.Fatal(err)
	}
	if before.Ino != after.Ino {
		t.Errorf("the pipe directory was made anew (inode %d, was %d)", after.Ino, before.Ino)
	}
	inContainer := filepath.Join("/proc", strconv.Itoa(os.Getpid()), "fd", strconv.Itoa(int(mounted.Fd())))
	if got := joinMPS(t, n.control, inContainer, env); got != "thread=25 mem=0=20480M" {
		t.Errorf("the seat's container, through the directory it mounts, got %q", got)
	}
}

// The 1x profile of sharingConfig, shared by time-slicing instead of MPS.
const sharingConfigTimeSliced = `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: timeSlicing}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  sharing: {timeSlicing: {interval: Long}}
`

// A profile switched from mps to timeSlicing while a claim holds one of
// its groups: the daemon stays for the claim's containers, stops with
// the claim's release, and the GPU goes back to DEFAULT.
func TestAProfileNoLongerMPSStopsItsDaemonAfterTheLastRelease(t *testing.T) {
	n := newMPSNode(t, sharingConfig)
	one := n.claim(class1x)
	n.prepareOK(one)
	first := n.daemons("g0-1x")

	n.plan = simnodetest.New(t, "nvlink-2x4", sharingConfigTimeSliced).Plan
	n.restart()
	if got := n.daemons("g0-1x"); !slices.Equal(got, first) {
		t.Errorf("daemons %v after the restart, want %v kept for the claim that holds the group", got, first)
	}
	n.unprepare(one)
	if got := n.daemons("g0-1x"); len(got) != 0 {
		t.Errorf("daemons %v after the last release of a group no longer shared with MPS", got)
	}
	if m := n.sim.ComputeMode(0); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 0 is %s after the release", simnode.ComputeModeName(m))
	}
	if _, err := os.Stat(filepath.Join(n.root, "g0-1x")); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory after the release: %v", err)
	}
}

// During a rolling update the old and the new plugin instance serve the
// node at once, each with its own view of the claims and its own watcher
// of the daemons. A daemon the new instance started for its claim is not
// stopped by the old one, whose view lacks the claim: a decision to stop
// reads the checkpoint they share first.
func TestRollingUpdateInstancesKeepEachOthersMPSDaemons(t *testing.T) {
	n := newMPSNode(t, sharingConfig, func(e *env) {
		prev := e.opts
		e.opts = func(o *draplugin.Options) { prev(o); o.PodUID = "pod-old" }
	})
	old := n.dra
	n.opts = mpsOptions(t, n.env, n.root, n.control, nil, func(o *draplugin.Options) { o.PodUID = "pod-new" })
	n.start()
	one := n.claim(class1x)
	env, _ := n.container(n.prepareOK(one)...)
	first := n.daemons("g0-1x")
	if len(first) != 1 {
		t.Fatalf("daemons of g0-1x %v, want one", first)
	}
	// Many watches of the old instance go by.
	time.Sleep(500 * time.Millisecond)
	if got := n.daemons("g0-1x"); !slices.Equal(got, first) {
		t.Fatalf("daemons %v, want %v: the old instance stopped a daemon the new one's claim uses", got, first)
	}
	if got := joinMPS(t, n.control, n.pipe("g0-1x"), env); got != "thread=25 mem=0=20480M" {
		t.Errorf("the new instance's claim got %q", got)
	}
	// The old instance releases it: the daemon goes.
	n.dra = old
	n.unprepare(one)
	if got := n.daemons("g0-1x"); len(got) != 0 {
		t.Errorf("daemons %v after the last release", got)
	}
}
