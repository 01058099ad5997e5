package mps

import (
	"errors"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// A record names one process: a PID now held by another process (another
// start time), or one of an earlier boot, is not the daemon, and is never
// signalled.
func TestARecordSignalsOnlyTheProcessItNames(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rec, err := newRecord(cmd.Process.Pid, "boot-1")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.alive("boot-1") {
		t.Fatalf("a running process's own record %+v is not alive", rec)
	}
	for name, other := range map[string]record{
		"another start time": {PID: rec.PID, StartTime: rec.StartTime + 1, BootID: rec.BootID},
		"an earlier boot":    {PID: rec.PID, StartTime: rec.StartTime, BootID: "an-earlier-boot"},
	} {
		if other.alive("boot-1") {
			t.Errorf("%s: the record is alive", name)
		}
		if err := other.signal(unix.SIGTERM, "boot-1"); !errors.Is(err, errGone) {
			t.Errorf("%s: signal = %v, want errGone", name, err)
		}
	}
	if err := unix.Kill(cmd.Process.Pid, 0); err != nil {
		t.Fatalf("the process was signalled through a record that is not its own: %v", err)
	}
	if err := rec.signal(unix.SIGTERM, "boot-1"); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if rec.alive("boot-1") {
		t.Error("the record of an ended process is alive")
	}
}

func TestParseStatReadsPastACommandNameWithParenthesesAndSpaces(t *testing.T) {
	tests := []struct {
		name      string
		line      string
		wantState byte
		wantStart uint64
		wantErr   bool
	}{
		{"plain", "4242 (nvidia-cuda-mps) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 10000 100", 'S', 987654, false},
		{"parentheses and spaces", "4242 (a) b (c) Z 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123 0 0", 'Z', 123, false},
		{"truncated", "4242 (x) S 1 2 3", 0, 0, true},
		{"no command", "4242 S 1", 0, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			state, start, err := parseStat([]byte(tc.line))
			if (err != nil) != tc.wantErr || state != tc.wantState || start != tc.wantStart {
				t.Errorf("parseStat = %q, %d, %v; want %q, %d, error %v", state, start, err, tc.wantState, tc.wantStart, tc.wantErr)
			}
		})
	}
}
