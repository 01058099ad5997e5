package simnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"
)

func TestParseFault(t *testing.T) {
	for _, tt := range []struct {
		line string
		want Fault
		err  string
	}{
		{line: "xid 0 79", want: Fault{Op: "xid", GPU: 0, XID: 79}},
		{line: "  ecc   3 ", want: Fault{Op: "ecc", GPU: 3}},
		{line: "lost 5", want: Fault{Op: "lost", GPU: 5}},
		{line: "recover 5", want: Fault{Op: "recover", GPU: 5}},
		{line: "xid 0 31 3", want: Fault{Op: "xid", GPU: 0, XID: 31, Instance: &EventInstance{GPUInstance: 3, ComputeInstance: NoInstanceID}}},
		{line: "xid 1 31 0 0", want: Fault{Op: "xid", GPU: 1, XID: 31, Instance: &EventInstance{GPUInstance: 0, ComputeInstance: 0}}},
		{line: "ecc 1 2", want: Fault{Op: "ecc", GPU: 1, Instance: &EventInstance{GPUInstance: 2, ComputeInstance: NoInstanceID}}},
		{line: "xid 0", err: "xid takes 2 argument(s) and at most 2 more (GI, CI), got 1"},
		{line: "ecc 1 2 3 4", err: "ecc takes 1 argument(s) and at most 2 more (GI, CI), got 4"},
		{line: "lost 1 2", err: "lost takes 1 argument(s), got 2"},
		{line: "xid 0 31 gi", err: `GI "gi" is not an instance ID`},
		{line: "xid 0 31 1 4294967295", err: `CI "4294967295" is not an instance ID`},
		{line: "xid 0 zero", err: `XID "zero" is not a positive number`},
		{line: "xid -1 79", err: `GPU "-1" is not an index`},
		{line: "reset 1", err: `unknown command "reset"`},
		{line: "action 2 gpu-reset", want: Fault{Op: "action", GPU: 2, Action: nvml.GPU_RECOVERY_ACTION_GPU_RESET}},
		{line: "action 2 none", want: Fault{Op: "action", GPU: 2, Action: nvml.GPU_RECOVERY_ACTION_NONE}},
		{line: "action 2 reset", err: `recovery action "reset": want one of none, gpu-reset, node-reboot, drain-p2p, drain-and-reset`},
		{line: "action 2", err: "action takes 2 argument(s), got 1"},
	} {
		t.Run(tt.line, func(t *testing.T) {
			got, err := ParseFault(tt.line)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// received drains an event set: "gpu:type:data:gi/ci" per event, "-" for
// an instance ID that names none (NoInstanceID).
func received(t *testing.T, n *Node, set nvml.EventSet, count int) []string {
	t.Helper()
	var out []string
	for i := 0; i < count; i++ {
		ev, ret := set.Wait(5000)
		if ret != nvml.SUCCESS {
			t.Fatalf("event %d of %d: %v (got %v)", i+1, count, ret, out)
		}
		idx, _ := ev.Device.GetIndex()
		id := func(x uint32) string {
			if x == NoInstanceID {
				return "-"
			}
			return fmt.Sprint(x)
		}
		out = append(out, fmt.Sprintf("%d:%d:%d:%s/%s", idx, ev.EventType, ev.EventData, id(ev.GpuInstanceId), id(ev.ComputeInstanceId)))
	}
	if ev, ret := set.Wait(50); ret == nvml.SUCCESS {
		t.Fatalf("unexpected extra event %+v after %v", ev, out)
	}
	return out
}

func TestWatchFaultsAppliesAppendedLinesOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n, err := Load("dgx-h100", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	set, _ := n.NVML().EventSetCreate()
	defer func() { _ = set.Free() }()
	for i := 0; i < 8; i++ {
		d, _ := n.NVML().DeviceGetHandleByIndex(i)
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError|nvml.EventTypeGpuUnavailableError, set); ret != nvml.SUCCESS {
			t.Fatalf("register GPU %d for events: %v", i, ret)
		}
	}
	path := filepath.Join(t.TempDir(), "faults")
	// Lines already there when the watch starts are history, not news.
	if err := os.WriteFile(path, []byte("xid 1 48\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.WatchFaults(ctx, path, 10*time.Millisecond)
	}()
	appendLine := func(s string) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // let the watch skip the existing line
	appendLine("# a comment\n\nxid 0 79\necc 3\nxid 2 31 3 0\necc 4 1\nbogus 1\nlos")
	// Type 8 is an XID event, 2 a double-bit ECC error; an event of the
	// whole GPU names no instance, one of a MIG instance names it on its
	// GPU's handle; "bogus" is skipped, "los" waits for the rest of its
	// line.
	got := received(t, n, set, 4)
	if want := []string{"0:8:79:-/-", "3:2:0:-/-", "2:8:31:3/0", "4:2:0:1/-"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("events %v, want %v", got, want)
	}
	appendLine("t 5\n")
	got = received(t, n, set, 1)
	if got[0] != "5:16384:0:-/-" { // a GPU-unavailable event
		t.Errorf("lost event %v", got)
	}
	if _, ret := mustDevice(t, n, 5).GetUUID(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("lost GPU 5 answers %v, want ERROR_GPU_IS_LOST", ret)
	}
	appendLine("recover 5\n")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ret := mustDevice(t, n, 5).GetUUID(); ret == nvml.SUCCESS {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("GPU 5 still does not answer after recover")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

func mustDevice(t *testing.T, n *Node, i int) nvml.Device {
	t.Helper()
	d, ret := n.NVML().DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return d
}

// recoveryAction reads GPU i's recovery-action field as the plugin does:
// the action, or the field's own return code.
func recoveryAction(t *testing.T, n *Node, i int) string {
	t.Helper()
	dev, ret := n.NVML().DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}, {FieldId: nvml.FI_DEV_RESET_STATUS}}
	if ret := dev.GetFieldValues(values); ret != nvml.SUCCESS {
		t.Fatalf("GetFieldValues: %v", ret)
	}
	if ret := nvml.Return(values[0].NvmlReturn); ret != nvml.SUCCESS {
		return nvmlErrorString(ret)
	}
	if other := nvml.Return(values[1].NvmlReturn); other != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("a field the simulated node does not serve answered %v", other)
	}
	if values[0].ValueType != uint32(nvml.VALUE_TYPE_UNSIGNED_INT) {
		t.Errorf("value type %d, want unsigned int", values[0].ValueType)
	}
	return RecoveryActions[values[0].Value[0]]
}

// The recovery-action field answers what the driver was last said to ask
// for, a change from the fault-injection file comes with its event, and a
// GPU under an older driver, or a lost one, does not answer it.
func TestTheRecoveryActionFieldAnswersWhatTheDriverSays(t *testing.T) {
	n, err := Load("dgx-h100", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	set, _ := n.NVML().EventSetCreate()
	dev, _ := n.NVML().DeviceGetHandleByIndex(2)
	if ret := dev.RegisterEvents(nvml.EventTypeGpuRecoveryAction, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if got := recoveryAction(t, n, 2); got != "none" {
		t.Errorf("a GPU nothing happened to asks for %q, want none", got)
	}
	f, err := ParseFault("action 2 drain-and-reset")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Apply(f); err != nil {
		t.Fatal(err)
	}
	if got := received(t, n, set, 1); !reflect.DeepEqual(got, []string{"2:32768:4:-/-"}) {
		t.Errorf("events %v, want GPU 2's recovery action (4)", got)
	}
	if got := recoveryAction(t, n, 2); got != "drain-and-reset" {
		t.Errorf("GPU 2 asks for %q, want drain-and-reset", got)
	}
	if got := recoveryAction(t, n, 3); got != "none" {
		t.Errorf("GPU 3 asks for %q, want none", got)
	}
	if err := n.SetRecoveryActionSupported(2, false); err != nil {
		t.Fatal(err)
	}
	if got := recoveryAction(t, n, 2); got != "Not Supported" {
		t.Errorf("a GPU whose driver lacks the field answered %q", got)
	}
	if err := n.SetLost(3, true); err != nil {
		t.Fatal(err)
	}
	if got := recoveryAction(t, n, 3); got != "GPU is lost" {
		t.Errorf("a lost GPU answered %q", got)
	}
}
