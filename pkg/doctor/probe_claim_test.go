package doctor

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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
		containeredits.Options{DeviceNumbers: n.deviceNumbers(), Driver: files})
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

// A spec can give a container the device node of a GPU the checkpoint
// does not record for the claim and keep CUDA from enumerating it: hide it
// with CUDA_VISIBLE_DEVICES, which a process in the container may unset;
// or put it where CUDA does not look, which root in the container may
// link to /dev/nvidia<N>. The container can open that GPU either way, so
// the probe fails the spec as it fails one that gives the GPU in plain
// sight: by what the spec's device nodes are on the host (their host
// path, under a driver root too, or their numbers), and by what CUDA sees
// with CUDA_VISIBLE_DEVICES unset.
func TestProbeOfAClaimFailsASpecThatGivesAnotherGPUOutOfCUDAsSight(t *testing.T) {
	const uid = types.UID("1c2d3e4f-0000-4000-8000-000000000009")
	tests := []struct {
		name string
		// env, nodes and mounts are JSON list entries, each followed by a
		// comma; %U0% is GPU 0's UUID, %DRIVER% the driver root and %ROOT%
		// the test's root.
		env, nodes, mounts string
		// unset: only the probe with CUDA_VISIBLE_DEVICES unset sees it.
		unset bool
	}{
		{name: "the node hidden by CUDA_VISIBLE_DEVICES", env: `"CUDA_VISIBLE_DEVICES=%U0%",`, nodes: `{"path":"/dev/nvidia1"},`},
		{name: "the node at a path CUDA does not scan", nodes: `{"path":"/dev/nvidia-spare","hostPath":"/dev/nvidia1"},`},
		{name: "the node under a driver root, at a path CUDA does not scan", nodes: `{"path":"/dev/nvidia-spare","hostPath":"%DRIVER%/dev/nvidia1"},`},
		{name: "the node by its numbers, at a path CUDA does not scan", nodes: `{"path":"/dev/nvidia-spare","hostPath":"/dev/nvidia0","type":"c","major":195,"minor":1},`},
		{name: "the node bind-mounted at a path CUDA does not scan", mounts: `{"hostPath":"/dev/nvidia1","containerPath":"/dev/nvidia-spare","options":["ro","bind"]},`},
		{name: "a directory of nodes mounted at /dev, hidden by CUDA_VISIBLE_DEVICES", env: `"CUDA_VISIBLE_DEVICES=%U0%",`,
			mounts: `{"hostPath":"%ROOT%/gpus","containerPath":"/dev","options":["rw","rbind"]},`, unset: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, inv := probeNode(t)
			n.write(filepath.Join(n.opts.Node.DriverRoot, "dev/nvidia1"), inv.GPUs[1].UUID+"\n")
			for i, name := range []string{"nvidia0", "nvidia1", "nvidiactl"} {
				text := ""
				if i < 2 {
					text = inv.GPUs[i].UUID + "\n"
				}
				n.write(filepath.Join(n.root, "gpus", name), text)
			}
			// A directory bound at /dev is the container's whole /dev: the
			// driver needs its /dev/null there too.
			if err := unix.Mknod(filepath.Join(n.root, "gpus", "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
			nodes := `{"path":"/dev/nvidia0"},` + tt.nodes + `{"path":"/dev/nvidiactl"}`
			if tt.unset {
				nodes = ""
			}
			expand := strings.NewReplacer("%U0%", inv.GPUs[0].UUID, "%DRIVER%", n.opts.Node.DriverRoot, "%ROOT%", n.root)
			n.write(filepath.Join(n.opts.CDIRoot, cdi.SpecName(uid)+".json"), expand.Replace(`{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu","devices":[{"name":"`+string(uid)+`-g0-1x-0","containerEdits":{
				"env":[`+tt.env+`"NVIDIA_VISIBLE_DEVICES=%U0%"],
				"deviceNodes":[`+nodes+`],
				"mounts":[`+tt.mounts+`{"hostPath":"%DRIVER%/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05","containerPath":"/usr/lib/x86_64-linux-gnu/libcuda.so.1","options":["ro","bind"]}]}}]}`))
			n.recordClaim(inv, uid, "G0", []int{0})
			n.opts.Probe.Claim = uid
			c := check(t, n.run(t), "probe")
			want := "claim " + string(uid) + ": the spec gives the device node of GPU 1 " + inv.GPUs[1].UUID + ", which CUDA did not enumerate; the checkpoint records " + uuids(inv, 0) + " for the claim"
			if tt.unset {
				want = "claim " + string(uid) + " with CUDA_VISIBLE_DEVICES unset: the probe saw " + uuids(inv, 0, 1) + ", the checkpoint records " + uuids(inv, 0) + " for the claim"
			}
			if c.Status != Fail || c.Summary != want || c.Fix == "" {
				t.Errorf("probe: %s %q\nwant fail with %q", c.Status, c.Summary, want)
			}
		})
	}
}
