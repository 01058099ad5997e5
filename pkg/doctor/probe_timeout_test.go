package doctor

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

// proc is a process as /proc/<pid>/stat has it.
type proc struct {
	pid, ppid, pgrp int
	comm            string
}

// procs lists the processes running now.
func procs(t *testing.T) []proc {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []proc
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // gone since
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		open, close := strings.IndexByte(string(data), '('), strings.LastIndexByte(string(data), ')')
		fields := strings.Fields(string(data[close+1:]))
		if open < 0 || close < open || len(fields) < 3 {
			t.Fatalf("%s: %q", path, data)
		}
		p := proc{comm: string(data[open+1 : close])}
		p.pid, _ = strconv.Atoi(strings.TrimSpace(string(data[:open])))
		p.ppid, _ = strconv.Atoi(fields[1])
		p.pgrp, _ = strconv.Atoi(fields[2])
		out = append(out, p)
	}
	return out
}

// probeGroup finds the process group of the probe this test started (it
// runs as /probe in the sandbox) and how many processes it holds.
func probeGroup(t *testing.T) (pgrp, members int) {
	all := procs(t)
	for _, p := range all {
		if p.ppid == os.Getpid() && p.comm == "probe" {
			pgrp = p.pgrp
		}
	}
	for _, p := range all {
		if pgrp != 0 && p.pgrp == pgrp {
			members++
		}
	}
	return pgrp, members
}

// TestProbeThatHangsIsKilledWithWhatItForked runs the doctor on a node
// whose libcuda's cuInit never returns (a wedged GPU) and forks first: the
// doctor gives up after --probe-timeout, says what that usually means, and
// leaves no process of the probe behind.
func TestProbeThatHangsIsKilledWithWhatItForked(t *testing.T) {
	buildProbe(t)
	n, _ := probeNodeWith(t, hangCUDA)
	const timeout = 3 * time.Second
	n.opts.Probe.Timeout = timeout
	_, ctx := ktesting.NewTestContext(t)
	done := make(chan *Report, 1)
	go func() { done <- Run(ctx, n.opts) }()

	// The probe and the process it forked, while they hang.
	var pgrp, members int
	for members < 2 {
		select {
		case r := <-done:
			t.Fatalf("the doctor returned before the probe forked: %+v", check(t, r, "probe"))
		case <-time.After(20 * time.Millisecond):
		}
		pgrp, members = probeGroup(t)
	}
	if pgrp == syscall.Getpgrp() {
		// Killing it would kill the test; the hang below shows the rest.
		t.Errorf("the probe runs in the doctor's process group %d: what it forks cannot be killed with it", pgrp)
	} else {
		t.Cleanup(func() { _ = syscall.Kill(-pgrp, syscall.SIGKILL) })
	}

	var r *Report
	select {
	case r = <-done:
	case <-time.After(timeout + 30*time.Second):
		t.Fatalf("the doctor has not returned %s after its probe timeout", 30*time.Second)
	}
	var out bytes.Buffer
	if err := WriteTable(&out, r); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	c := check(t, r, "probe")
	if want := "the probe did not finish within 3s (--probe-timeout) and was killed"; c.Status != Fail || !strings.Contains(c.Summary, want) ||
		!strings.Contains(c.Fix, "wedged GPU") || !strings.Contains(c.Fix, "Xid") || !strings.Contains(c.Fix, "nvidia-smi") {
		t.Errorf("probe: %s %q (fix: %q), want fail with %q", c.Status, c.Summary, c.Fix, want)
	}
	if err := syscall.Kill(-pgrp, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the probe's process group %d is still there (%v)", pgrp, err)
	}
	for _, p := range procs(t) {
		if p.pgrp == pgrp {
			t.Errorf("process %d (%s) of the probe's group is left behind", p.pid, p.comm)
		}
	}
}
