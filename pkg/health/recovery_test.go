package health

import (
	"testing"
	"time"
)

// Where the driver reports a recovery action, an XID makes its GPU
// unhealthy while the driver asks for one, whatever the XID policy and the
// recovery period say, and the GPU is healthy again at the first probe
// once it asks for none (unless the recovery period still holds it).
// Where the driver does not report one, the rules are as they were.
func TestTheDriversRecoveryActionHoldsAnXID(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "an ignored XID with a reset pending taints until the driver asks for nothing",
			steps: []step{
				{0, "set-action 2 gpu-reset", ""},
				{0, "xid 2 13", "2:xid-13"},
				{time.Hour, "probe", "2:xid-13"},
				{time.Hour, "set-action 2 none", "2:xid-13"},
				{time.Hour + time.Second, "probe", ""},
			},
		},
		{
			name: "a critical XID stays past its recovery period while a reset is pending",
			steps: []step{
				{0, "set-action 1 gpu-reset", ""},
				{0, "xid 1 79", "1:xid-79"},
				{5 * time.Minute, "probe", "1:xid-79"},
				{time.Hour, "probe", "1:xid-79"},
				{time.Hour, "action 1 none", ""},
			},
		},
		{
			name: "once the driver asks for nothing, the recovery period of a critical XID still counts",
			steps: []step{
				{0, "set-action 1 node-reboot", ""},
				{0, "xid 1 79", "1:xid-79"},
				{time.Minute, "action 1 none", "1:xid-79"},
				{5 * time.Minute, "probe", ""},
			},
		},
		{
			name: "an ignored XID with nothing pending is ignored as before",
			steps: []step{
				{0, "xid 3 13", ""},
				{time.Second, "probe", ""},
			},
		},
		{
			name: "a recovery action without an XID seen here taints, and clears",
			steps: []step{
				{0, "action 4 drain-and-reset", "4:recovery-drain-and-reset"},
				{time.Hour, "probe", "4:recovery-drain-and-reset"},
				{time.Hour, "set-action 4 none", "4:recovery-drain-and-reset"},
				{time.Hour + time.Second, "probe", ""},
			},
		},
		{
			name: "a recovery action pending before the monitor started is found by a probe",
			steps: []step{
				{0, "set-action 5 drain-p2p", ""},
				{time.Second, "probe", "5:recovery-drain-p2p"},
			},
		},
		{
			name: "without the field, an ignored XID is ignored and a critical one recovers after its period",
			steps: []step{
				{0, "no-action-field 2", ""},
				{0, "set-action 2 gpu-reset", ""},
				{0, "xid 2 13", ""},
				{0, "xid 2 79", "2:xid-79"},
				{5 * time.Minute, "probe", ""},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, nil)
			for _, s := range tt.steps {
				r.do(s.at, s.do)
				if got := r.faults(); got != s.want {
					t.Fatalf("after %q at +%v: unhealthy %q, want %q", s.do, s.at, got, s.want)
				}
			}
		})
	}
}

func TestARecoveryActionSaysWhatTheDriverAsksFor(t *testing.T) {
	r := newRig(t, nil)
	r.do(0, "set-action 2 gpu-reset")
	r.do(0, "xid 2 13")
	r.do(0, "action 3 node-reboot")
	got := messages(r.m.Faults())
	for gpu, want := range map[int]string{
		2: "XID 13 (graphics engine exception); the driver asks for a GPU reset",
		3: "the driver asks for a node reboot (NVML GPU recovery action)",
	} {
		if got[gpu] != want {
			t.Errorf("GPU %d: %q, want %q", gpu, got[gpu], want)
		}
	}
	if f := r.m.Faults()[3]; f.Kind != KindRecoveryAction || !f.Since.Equal(t0) {
		t.Errorf("GPU 3 fault %+v", f)
	}
	if reports := r.m.ReportsRecoveryActions(); !reports[2] || !reports[3] {
		t.Errorf("GPUs reporting recovery actions %v, want 2 and 3 among them", reports)
	}
}

// The monitor registers each GPU for the events it watches that the GPU
// supports: the recovery action's among them.
func TestTheMonitorRegistersForRecoveryActionEvents(t *testing.T) {
	r := newRig(t, nil)
	const want = 0x8000 | 0x4000 | 0x0008 | 0x0002 // recovery action, GPU unavailable, XID, double-bit ECC
	for gpu, mask := range r.m.Registered() {
		if mask != want {
			t.Errorf("GPU %d registered for %#x, want %#x", gpu, mask, want)
		}
	}
	if n := len(r.m.Registered()); n != 8 {
		t.Errorf("%d GPUs registered, want 8", n)
	}
}
