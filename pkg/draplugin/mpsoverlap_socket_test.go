package draplugin_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// Both profiles share their groups with MPS, over the same GPUs: g0-1x
// and g01-2x overlap on GPU 0. The configuration allows it; the ledger
// keeps them from being held at once.
const overlappingMPSConfig = `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  sharing: {strategy: mps}
`

// The release of g01-2x's last claim cannot confirm its daemon's stop
// (the daemon ends neither on quit nor on SIGTERM: SIGSTOPped, or stuck
// in the driver), but the release succeeds and the ledger frees GPUs 0
// and 1. The prepare of a g0-1x claim on GPU 0 then fails, saying which
// daemon still serves the GPU, rather than start a second daemon there.
// Once g01-2x's daemon has ended and the watcher finished its stop, the
// prepare, retried as the kubelet does, starts g0-1x's daemon, alone on
// GPU 0, which stays EXCLUSIVE_PROCESS; GPU 1 is DEFAULT again.
func TestMPSGroupsThatShareAGPUNeverRunDaemonsAtOnce(t *testing.T) {
	n := newMPSNode(t, overlappingMPSConfig)
	wide := n.claim(class2x)
	n.prepareOK(wide)
	widePIDs := n.daemons("g01-2x")
	if len(widePIDs) != 1 {
		t.Fatalf("daemons of g01-2x %v, want one", widePIDs)
	}
	t.Cleanup(func() {
		for _, pid := range widePIDs {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	mpstest.Stop(t, widePIDs[0])
	if r := n.unprepare(wide)[string(wide.UID)]; r == nil || r.Error != "" {
		t.Fatalf("release of the wide claim: %+v", r)
	}
	n.cluster.Release(wide.Status.Allocation)

	narrow := n.claim(class1x)
	if got := narrow.Status.Allocation.Devices.Results[0].Device; got != "g0-1x" {
		t.Fatalf("the narrow claim got %s, want g0-1x (on GPU 0)", got)
	}
	r := n.prepare(narrow)[string(narrow.UID)]
	if got := n.daemons("g0-1x"); r == nil || r.Error == "" || len(got) > 0 {
		t.Errorf("prepare of g0-1x while g01-2x's daemon %v still runs on GPU 0: %+v, daemons of g0-1x %v; want it refused, no daemon started", widePIDs, r, got)
	} else if !strings.Contains(r.Error, "is served by the MPS daemon of group g01-2x") {
		t.Errorf("prepare of g0-1x: %q, want the reason: GPU 0 is served by g01-2x's daemon", r.Error)
	}

	// g01-2x's daemon can end now; the watcher finishes its stop.
	if err := syscall.Kill(widePIDs[0], syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "g01-2x's daemon to end", func() bool { return len(n.daemons("g01-2x")) == 0 })
	waitFor(t, "the watcher to finish g01-2x's stop", func() bool { return !groupDirExists(n.root, "g01-2x") })
	n.prepareOK(narrow)
	if got := n.daemons("g0-1x"); len(got) != 1 {
		t.Fatalf("daemons of g0-1x %v after the retried prepare, want one", got)
	}
	if m := n.sim.ComputeMode(0); m != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 0 is %s while g0-1x's daemon %v serves it: its processes bypass MPS", simnode.ComputeModeName(m), n.daemons("g0-1x"))
	}
	if m := n.sim.ComputeMode(1); m != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 1, which no daemon serves any more, is %s", simnode.ComputeModeName(m))
	}
}

func groupDirExists(root, name string) bool {
	_, err := os.Stat(filepath.Join(root, name))
	return err == nil
}
