package doctor

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
)

// On nvlink-2x4 (80 GiB GPUs): sized single GPUs G0, G1, G2, a sized pair
// G45, and equal seats on GPUs 6 and 7.
const sizedConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 4
  gpus: [0, 1, 2]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 2
  gpus: [4, 5]
  sharing: {strategy: mps, sized: true}
- {resource: kyb.ai/gpu-1x-seat, gpus: [6, 7]}
`

// sizedHolder is a claim holding one sized seat of a group.
type sizedHolder struct {
	uid, name, group, device string
	gpus                     []int
	memoryGiB, compute       int64
}

// checkpointSized writes a checkpoint of the sized seats held, with the
// simulated node's GPU UUIDs.
func (n *node) checkpointSized(holders []sizedHolder) {
	n.t.Helper()
	_, ctx := ktesting.NewTestContext(n.t)
	host, err := n.opts.Node.OpenHost(ctx)
	if err != nil {
		n.t.Fatal(err)
	}
	defer func() { _ = host.Close() }()
	inv, err := nodesetup.Discover(ctx, host)
	if err != nil {
		n.t.Fatal(err)
	}
	st := checkpoint.New()
	seats := map[string]int{}
	for _, h := range holders {
		seat := seats[h.device]
		seats[h.device]++
		st.Generations[checkpoint.SeatKey(h.device, seat)] = 1
		dev := checkpoint.Device{Requests: []string{"gpu"}, Pool: "node-1", Device: h.device, GroupDevice: h.device, ShareID: h.uid, CDIDevice: h.device + "-" + h.name}
		dev.Profile = strings.SplitN(h.device, "-", 2)[1]
		dev.Group, dev.GPUs, dev.Seats, dev.Generations = h.group, h.gpus, []int{seat}, []int64{1}
		for _, x := range h.gpus {
			dev.GPUUUIDs = append(dev.GPUUUIDs, inv.GPUs[x].UUID)
		}
		dev.Size = &v1alpha1.SeatSize{MemoryBytes: h.memoryGiB << 30, ComputePercent: h.compute}
		st.Claims[types.UID(h.uid)] = &checkpoint.Claim{Namespace: "team-a", Name: h.name, Phase: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{dev}}
	}
	dir := driver.PluginDir(n.opts.PluginsDir)
	n.mkdir(dir)
	if err := checkpoint.NewStore(dir).Save(st); err != nil {
		n.t.Fatal(err)
	}
}

// The doctor reports each sized group's published sizes and the sizes
// its claims hold, and warns where the claims hold more than the group
// publishes, where a group's MPS daemon (a real manager's, over the
// simulated nvidia-cuda-mps-control) does not hold the largest size held
// or none is recorded, and where sized seats are held on a group today's
// plan does not publish sized.
func TestTheDoctorHoldsSizedGroupsAgainstTheirClaimsAndDaemons(t *testing.T) {
	n := newNode(t)
	n.opts.Node.Simulate = "nvlink-2x4"
	n.opts.Node.ConfigPath = n.write(filepath.Join(n.root, "config.yaml"), sizedConfig)
	n.opts.MPSRoot = mpstest.Root(t)
	n.checkpointSized([]sizedHolder{
		{"00000000-0000-4000-8000-000000000001", "a", "G0", "g0-1x-sized", []int{0}, 16, 30},
		{"00000000-0000-4000-8000-000000000002", "b", "G0", "g0-1x-sized", []int{0}, 40, 10},
		{"00000000-0000-4000-8000-000000000003", "c", "G1", "g1-1x-sized", []int{1}, 60, 50},
		{"00000000-0000-4000-8000-000000000004", "d", "G1", "g1-1x-sized", []int{1}, 30, 60},
		{"00000000-0000-4000-8000-000000000005", "e", "G45", "g45-2x-sized", []int{4, 5}, 30, 50},
		{"00000000-0000-4000-8000-000000000006", "f", "G6", "g6-1x-seat", []int{6}, 10, 10},
	})
	// G0's daemon holds the largest memory and compute held there, G45's
	// an equal share of its two seats, and G1 has none.
	_, ctx := ktesting.NewTestContext(t)
	m, err := mps.NewManager(mps.Options{Root: n.opts.MPSRoot, Control: []string{mpstest.Build(t)},
		SetExclusive: func(context.Context, string, bool) error { return nil }, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		group  mps.Group
		limits mps.Limits
	}{
		{mps.Group{Name: "g0-1x-sized", UUIDs: []string{"GPU-0"}}, mps.Sized(40<<30, 30, 1)},
		{mps.Group{Name: "g45-2x-sized", UUIDs: []string{"GPU-4", "GPU-5"}}, mps.Sized(40<<30, 50, 2)},
	} {
		if err := m.Ensure(ctx, d.group, mps.Fixed(d.limits)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Settle(context.Background(), d.group, mps.Unused()) })
	}

	c := check(t, n.run(t), "sized-seats")
	if c.Status != Warn || c.Summary != "4 sized groups; 5 sized seats held" {
		t.Errorf("sized-seats: %s, %q", c.Status, c.Summary)
	}
	want := []string{
		"G0 (g0-1x-sized, GPUs 0): publishes 4 seats, memory 80Gi per GPU (default 20Gi, min 1Gi, step 1Gi), compute 100 % (default 25); 2 sized seats hold 56Gi and 40 %: [team-a/a (16Gi, 30 %) team-a/b (40Gi, 10 %)]",
		"G1 (g1-1x-sized, GPUs 1): publishes 4 seats, memory 80Gi per GPU (default 20Gi, min 1Gi, step 1Gi), compute 100 % (default 25); 2 sized seats hold 90Gi and 110 %: [team-a/c (60Gi, 50 %) team-a/d (30Gi, 60 %)]",
		"warning: group G1's claims hold more than it publishes (90Gi of 80Gi per GPU, 110 of 100 %, 2 of 4 seats): the plugin refuses every further claim of the group at prepare until enough are released",
		"warning: no MPS daemon is recorded for group G1, whose sized seats are held: their containers reach no daemon until the plugin starts one (at its start, and its watcher's next check)",
		"G2 (g2-1x-sized, GPUs 2): publishes 4 seats, memory 80Gi per GPU (default 20Gi, min 1Gi, step 1Gi), compute 100 % (default 25); none held",
		"G45 (g45-2x-sized, GPUs 4,5): publishes 2 seats, memory 80Gi per GPU (default 40Gi, min 1Gi, step 1Gi), compute 100 % (default 50); 1 sized seat holds 30Gi and 50 %: [team-a/e (30Gi, 50 %)]",
		"warning: the MPS daemon of group G45 holds 50 % of the SMs and 0=40960M,1=40960M, and the largest size held there needs 50 % of the SMs and 0=30720M,1=30720M: a container may pin more than its size, or less than it was given",
		"warning: 1 claim holds sized seats of g6-1x-seat, which today's plan does not publish as a sized group: [team-a/f (10Gi, 10 %)]; the plugin holds their MPS limits until they are released",
	}
	if got := strings.Join(c.Details, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("details:\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	if !strings.Contains(c.Fix, "largest size held") {
		t.Errorf("fix: %q", c.Fix)
	}
}

// Claims whose sizes fit, and daemons that hold the largest held: ok.
func TestSizedGroupsThatAgreeAreOK(t *testing.T) {
	n := newNode(t)
	n.opts.Node.Simulate = "nvlink-2x4"
	n.opts.Node.ConfigPath = n.write(filepath.Join(n.root, "config.yaml"), sizedConfig)
	n.opts.MPSRoot = mpstest.Root(t)
	r := n.run(t)
	if c := check(t, r, "sized-seats"); c.Status != OK || c.Summary != "4 sized groups; 0 sized seats held" || len(c.Details) != 4 {
		t.Errorf("no claim held: %s %q %v", c.Status, c.Summary, c.Details)
	}
	n.checkpointSized([]sizedHolder{{"00000000-0000-4000-8000-000000000001", "a", "G2", "g2-1x-sized", []int{2}, 20, 25}})
	_, ctx := ktesting.NewTestContext(t)
	m, err := mps.NewManager(mps.Options{Root: n.opts.MPSRoot, Control: []string{mpstest.Build(t)},
		SetExclusive: func(context.Context, string, bool) error { return nil }, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
	if err != nil {
		t.Fatal(err)
	}
	g := mps.Group{Name: "g2-1x-sized", UUIDs: []string{"GPU-2"}}
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Sized(20<<30, 25, 1))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })
	r = n.run(t)
	if c := check(t, r, "sized-seats"); c.Status != OK || c.Summary != "4 sized groups; 1 sized seat held" {
		t.Errorf("a claim held, its daemon agreeing: %s %q %v", c.Status, c.Summary, c.Details)
	}
	if r.Counts[Warn] != 0 || r.Failed() {
		t.Errorf("a node whose sized seats agree: %v", r.Counts)
	}
}
