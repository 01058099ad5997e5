package simnode

import (
	"os"
	"strings"
	"testing"
)

func TestParseProcesses(t *testing.T) {
	good := "# GPU PID MEM SM\n\n0 10 1024 40 0::/kubepods/pod1/abc\n1 11 5 0\n"
	procs, err := ParseProcesses([]byte(good), "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 2 || procs[0] != (Process{GPU: 0, PID: 10, MemoryMiB: 1024, SMPercent: 40, Cgroup: "0::/kubepods/pod1/abc"}) || procs[1].Cgroup != "" {
		t.Errorf("parsed %+v", procs)
	}
	if again, _ := ParseProcesses(FormatProcesses(procs), "p"); len(again) != 2 || again[0] != procs[0] || again[1] != procs[1] {
		t.Errorf("FormatProcesses does not round-trip: %+v", again)
	}
	for _, tt := range []struct{ line, want string }{
		{"0 10 1024", "got 3 fields"},
		{"x 10 1024 40", `GPU "x" is not an index`},
		{"0 0 1024 40", `PID "0" is not a positive number`},
		{"0 10 lots 40", `MEMORY_MIB "lots" is not a number`},
		{"0 10 1024 101", `SM_PERCENT "101" is not 0-100`},
	} {
		_, err := ParseProcesses([]byte("0 1 1 1\n"+tt.line+"\n"), "procs")
		if err == nil || !strings.HasPrefix(err.Error(), "procs:2: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want procs:2: …%s", tt.line, err, tt.want)
		}
	}
}

// A processes file that stops parsing keeps the processes read before,
// and says why.
func TestABadProcessesFileKeepsTheLastGoodOne(t *testing.T) {
	n, err := Load("single-gpu", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	file := t.TempDir() + "/procs"
	n.SetProcessesFile(file)
	if err := n.ProcessesError(); err != nil || len(n.processesOn(0)) != 0 {
		t.Fatalf("no file: %v, %d processes", err, len(n.processesOn(0)))
	}
	if err := os.WriteFile(file, []byte("0 10 100 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := n.processesOn(0); len(got) != 1 || got[0].PID != 10 {
		t.Fatalf("processes %+v", got)
	}
	if err := os.WriteFile(file, []byte("0 10 100 5\n0 11 oops 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.ProcessesError(); err == nil || !strings.Contains(err.Error(), file+":2:") {
		t.Errorf("bad file: error %v, want its line", err)
	}
	if got := n.processesOn(0); len(got) != 1 || got[0].PID != 10 {
		t.Errorf("after a bad write: %+v, want the last good processes", got)
	}
}
