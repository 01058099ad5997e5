package doctor

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// recordClaim writes the plugin's checkpoint with a claim that holds seat
// 0 of group on gpus, as the plugin records a prepared claim.
func (n *node) recordClaim(inv *inventory.Inventory, uid types.UID, group string, gpus []int) {
	n.t.Helper()
	dev := checkpoint.Device{Requests: []string{"gpu"}, Pool: "node-1", Device: strings.ToLower(group) + "-1x", GroupDevice: strings.ToLower(group) + "-1x", CDIDevice: "seat"}
	dev.Profile, dev.Group, dev.GPUs, dev.Seats, dev.Generations = "1x", group, gpus, []int{0}, []int64{1}
	for _, x := range gpus {
		dev.GPUUUIDs = append(dev.GPUUUIDs, inv.GPUs[x].UUID)
	}
	st := checkpoint.New()
	st.Claims[uid] = &checkpoint.Claim{Namespace: "team-a", Name: "train", Phase: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{dev}}
	st.Generations[checkpoint.SeatKey(dev.GroupDevice, 0)] = 1
	dir := driver.PluginDir(n.opts.PluginsDir)
	n.mkdir(dir)
	if err := checkpoint.NewStore(dir).Save(st); err != nil {
		n.t.Fatal(err)
	}
}

// writeClaimSpec writes the spec the plugin would write for a claim
// holding seat 0 of group, giving it gpus.
func (n *node) writeClaimSpec(inv *inventory.Inventory, uid types.UID, group string, gpus []int) {
	n.t.Helper()
	files, err := containeredits.FindDriverFiles(n.opts.Node.DriverRoot, "")
	if err != nil {
		n.t.Fatal(err)
	}
	seat := containeredits.Seat{Group: group, Seats: []int{0}, Generations: []int64{1}}
	for _, x := range gpus {
		seat.GPUs = append(seat.GPUs, inv.GPUs[x])
	}
	edits, err := containeredits.Build([]containeredits.Seat{seat},
		containeredits.Options{DeviceNumbers: func(string) (int64, int64, error) { return 195, 0, nil }, Driver: files})
	if err != nil {
		n.t.Fatal(err)
	}
	w, err := cdi.NewWriter(n.opts.CDIRoot)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := w.Write(uid, []cdi.Device{{Name: "seat", Edits: edits}}); err != nil {
		n.t.Fatal(err)
	}
}

// uuids are the sorted UUIDs of GPUs, as the report prints them.
func uuids(inv *inventory.Inventory, gpus ...int) string {
	var out []string
	for _, x := range gpus {
		out = append(out, inv.GPUs[x].UUID)
	}
	slices.Sort(out)
	return fmt.Sprint(out)
}

// TestProbeOfAClaimExpectsTheGPUsTheCheckpointRecords: a claim's spec is
// what the probe checks, so the GPUs the claim must see come from the
// plugin's record of the claim, not from the spec. A spec that gives a
// 2-GPU claim 4 GPUs fails; a claim the checkpoint does not know fails.
func TestProbeOfAClaimExpectsTheGPUsTheCheckpointRecords(t *testing.T) {
	const uid = types.UID("3f1e2d4c-5b6a-4978-8a9b-0c1d2e3f4a5b")
	tests := []struct {
		name     string
		recorded []int // nil: the checkpoint records another claim
		given    []int
		want     func(inv *inventory.Inventory) string
		ok       bool
	}{
		{name: "a spec that gives the claim the GPUs recorded", recorded: []int{0, 1}, given: []int{0, 1}, ok: true,
			want: func(*inventory.Inventory) string {
				return "claim " + string(uid) + ": a container sees exactly its 2 GPUs and allocates on each"
			}},
		{name: "a spec that gives a 2-GPU claim 4 GPUs", recorded: []int{0, 1}, given: []int{0, 1, 2, 3},
			want: func(inv *inventory.Inventory) string {
				return "claim " + string(uid) + ": the probe saw " + uuids(inv, 0, 1, 2, 3) + ", the checkpoint records " + uuids(inv, 0, 1) + " for the claim"
			}},
		{name: "a spec that gives a claim other GPUs", recorded: []int{0, 1}, given: []int{2, 3},
			want: func(inv *inventory.Inventory) string {
				return "the probe saw " + uuids(inv, 2, 3) + ", the checkpoint records " + uuids(inv, 0, 1) + " for the claim"
			}},
		{name: "a claim the checkpoint does not know", given: []int{0, 1},
			want: func(*inventory.Inventory) string {
				return "claim " + string(uid) + " is not in the plugin's checkpoint, which records 1 claim: it is not prepared on this node, or was released since"
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, inv := probeNode(t)
			if tt.recorded != nil {
				n.recordClaim(inv, uid, "G01", tt.recorded)
			} else {
				n.recordClaim(inv, "0b7d9a0e-2b36-4f4e-9d5c-1f1c2c3d4e5f", "G01", []int{0, 1})
			}
			n.writeClaimSpec(inv, uid, "G01", tt.given)
			n.opts.Probe.Claim = uid
			c := check(t, n.run(t), "probe")
			want := tt.want(inv)
			if ok := c.Status == OK; ok != tt.ok || !strings.Contains(c.Summary, want) {
				t.Errorf("probe: %s %q, want ok=%v with %q", c.Status, c.Summary, tt.ok, want)
			}
		})
	}
}

// TestProbeOfAClaimWithoutACheckpoint: on a node where the plugin never
// ran, no claim is prepared, whatever the CDI root holds.
func TestProbeOfAClaimWithoutACheckpoint(t *testing.T) {
	const uid = types.UID("3f1e2d4c-5b6a-4978-8a9b-0c1d2e3f4a5b")
	n, inv := probeNode(t)
	n.writeClaimSpec(inv, uid, "G01", []int{0, 1})
	n.opts.Probe.Claim = uid
	c := check(t, n.run(t), "probe")
	if want := "is not in the plugin's checkpoint, which records 0 claims"; c.Status != Fail || !strings.Contains(c.Summary, want) {
		t.Errorf("probe: %s %q, want fail with %q", c.Status, c.Summary, want)
	}
}
