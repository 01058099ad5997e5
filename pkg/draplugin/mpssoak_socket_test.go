package draplugin_test

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// The MPS soak: random prepares and releases of one- and two-seat MPS
// claims, sized ones, and time-sliced pairs, plugin restarts, profile
// changes between mps, timeSlicing and sized mps, daemons killed, and a tenant's worst with the pipe
// directory mounted read-write: its control socket removed, or replaced by
// a link to another group's, and the daemon stopped (SIGSTOP, and SIGCONT
// later). It ends with a final settle (every daemon free to end, the
// plugin restarted, the watcher given a few rounds) and counts, from
// /proc, the simulated daemons' shared log and the simulated GPUs:
//
//   - daemons leaked: running while no claim holds their group, or a
//     second one on a group;
//   - daemons of another group touched: control connections that reached
//     a daemon through another group's pipe directory;
//   - GPUs in the wrong compute mode: EXCLUSIVE_PROCESS without a daemon
//     on them, or DEFAULT under one;
//
// once with the claims still held and once after all are released. All
// three must be 0. KYB_MPS_SOAK_ITERATIONS sets the length (make soak-mps
// runs hundreds; the unit run a few dozen), KYB_MPS_SOAK_SEED repeats a
// run.
func TestMPSSoak(t *testing.T) {
	iterations := 25
	if s := os.Getenv("KYB_MPS_SOAK_ITERATIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("KYB_MPS_SOAK_ITERATIONS=%q: %v", s, err)
		}
		iterations = n
	}
	seed := time.Now().UnixNano()
	if s := os.Getenv("KYB_MPS_SOAK_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (set KYB_MPS_SOAK_SEED to repeat)", seed)
	s := newSoak(t, rand.New(rand.NewSource(seed)))
	for range iterations {
		s.step()
	}
	var figures [3]int
	s.finalSettle()
	add(&figures, s.count(true))
	s.releaseAll()
	s.finalSettle()
	add(&figures, s.count(true))
	t.Logf("mps soak: seed %d, %d iterations: %s; daemons leaked %d, daemons of another group touched %d, GPUs in the wrong compute mode %d",
		seed, iterations, s.stats, figures[0], figures[1], figures[2])
	if figures != [3]int{} {
		t.Errorf("daemons leaked %d, daemons of another group touched %d, GPUs in the wrong compute mode %d: want 0, 0, 0", figures[0], figures[1], figures[2])
	}
}

func add(sum *[3]int, f [3]int) {
	for i := range sum {
		sum[i] += f[i]
	}
}

type soak struct {
	*mpsNode
	rng *rand.Rand
	log string
	// mode is how the 1x groups are shared from the plugin's last start
	// on: modes[mode].
	mode int
	held []*resourceapi.ResourceClaim
	// stopped are daemons stopped with SIGSTOP.
	stopped []int
	stats   soakStats
}

type soakStats struct {
	prepares, sized, refused, releases, restarts, profileChanges, tamperings, kills int
}

func (s soakStats) String() string {
	return fmt.Sprintf("%d prepares (%d sized, %d refused), %d releases, %d restarts, %d profile changes, %d tamperings, %d daemons killed",
		s.prepares, s.sized, s.refused, s.releases, s.restarts, s.profileChanges, s.tamperings, s.kills)
}

// sharingConfigSized sizes the 1x groups' MPS seats, under the names the
// other modes give them.
const sharingConfigSized = `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  sharing: {timeSlicing: {interval: Long}}
`

// modes are the soak's configurations, in the order it switches them.
var modes = []string{sharingConfig, sharingConfigTimeSliced, sharingConfigSized}

func newSoak(t *testing.T, rng *rand.Rand) *soak {
	log := filepath.Join(t.TempDir(), "daemons.log")
	// Short waits: each stop of a stopped daemon waits them out. The
	// pipe directory is writable, so that a tenant can tamper with it.
	n := newMPSNodeWith(t, sharingConfig, func(o *mps.Options) {
		// Daemons outlive their directory, as real ones do: one the
		// plugin lost track of is seen, not hidden.
		o.Env = []string{mpstest.LogEnv + "=" + log, mpstest.OutliveDirEnv + "=1"}
		o.ClientPipeWritable = true
		o.ControlTimeout, o.StopTimeout = 300*time.Millisecond, 300*time.Millisecond
	})
	t.Cleanup(func() {
		for pid := range mpstest.Daemons(t, n.control) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return &soak{mpsNode: n, rng: rng, log: log}
}

func (s *soak) step() {
	switch r := s.rng.Intn(20); {
	case r < 7:
		s.prepare()
	case r < 11 && len(s.held) > 0:
		s.release(s.rng.Intn(len(s.held)))
	case r < 12:
		s.stats.restarts++
		s.restart()
	case r < 13:
		s.switchProfile()
	case r < 17:
		s.tamper()
	case r < 18:
		s.kill()
	default:
		s.cont()
	}
}

// prepare allocates a claim as the scheduler would and prepares it; a
// claim the plugin refuses is deleted again.
func (s *soak) prepare() {
	s.claimN++
	class, mutate := class1x, []func(*resourceapi.DeviceRequest){}
	switch s.rng.Intn(4) {
	case 0:
		class = class2x
	case 1:
		mutate = append(mutate, seats(2))
	case 2:
		if modes[s.mode] == sharingConfigSized {
			mutate = append(mutate, sized([]string{"", "8Gi", "16Gi", "30Gi"}[s.rng.Intn(4)], []string{"", "10", "25", "40"}[s.rng.Intn(4)]))
			s.stats.sized++
		}
	}
	c := schedulertest.Claim(fmt.Sprintf("soak-%d", s.claimN), class, 1, mutate...)
	c.UID = types.UID(fmt.Sprintf("soak-%d", s.claimN))
	alloc, err := s.cluster.Allocate(s.ctx, c, nodeName)
	if err != nil || alloc == nil {
		return // no room
	}
	for i := range alloc.Devices.Results {
		alloc.Devices.Results[i].Pool = nodeName
	}
	c.Status.Allocation = alloc
	c = s.store(c)
	s.stats.prepares++
	if r := s.env.prepare(c)[string(c.UID)]; r == nil || r.Error != "" {
		s.stats.refused++
		s.t.Logf("prepare %s refused: %v", c.Name, r)
		s.unprepare(c)
		s.forget(c)
		return
	}
	s.held = append(s.held, c)
}

func (s *soak) release(i int) {
	c := s.held[i]
	s.held = slices.Delete(s.held, i, i+1)
	s.stats.releases++
	if r := s.unprepare(c)[string(c.UID)]; r != nil && r.Error != "" {
		s.t.Errorf("unprepare %s: %s", c.Name, r.Error)
	}
	s.forget(c)
}

func (s *soak) forget(c *resourceapi.ResourceClaim) {
	s.cluster.Release(c.Status.Allocation)
	if err := s.client.ResourceV1().ResourceClaims(c.Namespace).Delete(s.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *soak) releaseAll() {
	for len(s.held) > 0 {
		s.release(0)
	}
}

// switchProfile shares the 1x groups by MPS, by time-slicing or by sized
// MPS seats from the next plugin start on, which the scheduler sees in
// the node's slices; the claims that hold them keep them.
func (s *soak) switchProfile() {
	s.mode = (s.mode + 1) % len(modes)
	s.plan = simnodetest.New(s.t, "nvlink-2x4", modes[s.mode]).Plan
	s.cluster.SetNode(nodeName, draresources.Resources(s.plan, s.inv, nodeName, draresources.LayoutShared), driver.Name)
	s.stats.profileChanges++
	s.restart()
}

// groupsWithDaemons are the groups whose directory holds a control socket.
func (s *soak) groupsWithDaemons() []string {
	var out []string
	for _, pipe := range mpstest.Daemons(s.t, s.control) {
		out = append(out, filepath.Base(filepath.Dir(pipe)))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// tamper does what a tenant with the pipe directory mounted read-write,
// or someone on the host, may do to a daemon.
func (s *soak) tamper() {
	groups := s.groupsWithDaemons()
	if len(groups) == 0 {
		return
	}
	g := groups[s.rng.Intn(len(groups))]
	ctl := filepath.Join(s.pipe(g), mps.ControlSocket)
	s.stats.tamperings++
	switch s.rng.Intn(3) {
	case 0:
		_ = os.Remove(ctl)
	case 1:
		other := groups[s.rng.Intn(len(groups))]
		if other == g {
			return
		}
		_ = os.Remove(ctl)
		_ = os.Symlink(filepath.Join(s.pipe(other), mps.ControlSocket), ctl)
	default:
		for _, pid := range s.daemons(g) {
			if syscall.Kill(pid, syscall.SIGSTOP) == nil {
				s.stopped = append(s.stopped, pid)
			}
		}
	}
}

func (s *soak) kill() {
	groups := s.groupsWithDaemons()
	if len(groups) == 0 {
		return
	}
	for _, pid := range s.daemons(groups[s.rng.Intn(len(groups))]) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			s.stats.kills++
		}
	}
}

func (s *soak) cont() {
	for _, pid := range s.stopped {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	s.stopped = nil
}

// finalSettle lets every daemon end that is asked to, restarts the plugin
// (which settles every daemon it finds) and gives the watcher time to
// finish the stops that could not be confirmed before.
func (s *soak) finalSettle() {
	s.cont()
	s.restart()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && s.count(false) != [3]int{} {
		time.Sleep(50 * time.Millisecond)
	}
}

// heldGroups are the groups the claims hold.
func (s *soak) heldGroups() map[string]bool {
	out := map[string]bool{}
	for _, c := range s.held {
		for _, r := range c.Status.Allocation.Devices.Results {
			out[r.Device] = true
		}
	}
	return out
}

func (s *soak) leaked() int {
	held := s.heldGroups()
	perGroup := map[string]int{}
	for _, pipe := range mpstest.Daemons(s.t, s.control) {
		perGroup[filepath.Base(filepath.Dir(pipe))]++
	}
	n := 0
	for g, k := range perGroup {
		if held[g] {
			k--
		}
		n += k
	}
	return n
}

// count measures the three figures now; report logs the GPUs in the
// wrong compute mode.
func (s *soak) count(report bool) [3]int {
	var touched int
	if data, err := os.ReadFile(s.log); err == nil {
		touched = strings.Count(string(data), mpstest.Misdirected)
	}
	// A GPU is EXCLUSIVE_PROCESS exactly while a daemon runs on it (one
	// that should not run is counted as leaked).
	served := map[int]bool{}
	for _, pipe := range mpstest.Daemons(s.t, s.control) {
		if g := s.plan.GroupByDevice(filepath.Base(filepath.Dir(pipe))); g != nil {
			for _, x := range g.GPUs {
				served[x] = true
			}
		}
	}
	wrong := 0
	for i := range s.inv.GPUs {
		if exclusive := s.sim.ComputeMode(i) == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS; exclusive != served[i] {
			if report {
				s.t.Logf("GPU %d: EXCLUSIVE_PROCESS %v, under a daemon %v", i, exclusive, served[i])
			}
			wrong++
		}
	}
	return [3]int{s.leaked(), touched, wrong}
}
