package health

import (
	"strings"
	"testing"
	"time"
)

// A GPU held by its driver's recovery action alone is tainted with what
// the driver asks for (recovery-gpu-reset), which is what an operator
// acts on. When the driver then asks for more (a node reboot: the reset
// did not help, or the fault spread), the taint and its message must say
// so: a GPU still tainted "recovery-gpu-reset" sends the operator to
// reset it again, which cannot clear it.
func TestARecoveryActionThatChangesChangesTheTaint(t *testing.T) {
	r := newRig(t, nil)
	r.do(0, "action 4 gpu-reset")
	if got := r.faults(); got != "4:recovery-gpu-reset" {
		t.Fatalf("after the driver asked for a GPU reset: %q", got)
	}
	r.do(time.Minute, "action 4 node-reboot")
	if got := r.faults(); got != "4:recovery-node-reboot" {
		t.Errorf("after the driver asked for a node reboot instead: unhealthy %q, want 4:recovery-node-reboot", got)
	}
	if msg := r.m.Faults()[4].Message; !strings.Contains(msg, "node reboot") {
		t.Errorf("GPU 4's fault says %q, not that the driver asks for a node reboot", msg)
	}
}

// A driver that stops reporting the recovery action (the field answers
// NOT_SUPPORTED from then on) "leaves the rules as they were"
// (recovery.go): an XID the policy ignores then holds no GPU, as it would
// not have from the start and does not in a plugin restarted now. A GPU
// held before stays held for as long as the plugin runs instead.
func TestAGPUWhoseDriverStopsReportingRecoveryActionsIsNotHeldForEver(t *testing.T) {
	r := newRig(t, nil)
	r.do(0, "set-action 2 gpu-reset")
	r.do(0, "xid 2 13")
	if got := r.faults(); got != "2:xid-13" {
		t.Fatalf("an ignored XID with a reset pending: unhealthy %q, want 2:xid-13", got)
	}
	r.do(time.Minute, "no-action-field 2")
	r.do(24*time.Hour, "probe")
	if got := r.faults(); got != "" {
		t.Errorf("a day after the driver stopped reporting recovery actions, with nothing wrong since: unhealthy %q, want none", got)
	}
}
