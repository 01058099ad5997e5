// Package e2enode runs real pods on real nodes: a kubelet with containerd
// and runc (package realnode) joined to the in-process control plane, the
// driver's own binaries on them. make e2e-node builds what it needs and
// runs it; the tests refuse to run without it rather than pass unseen.
package e2enode

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

var tools realnode.Tools

func TestMain(m *testing.M) {
	var err error
	if tools, err = realnode.ToolsFromEnv(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(1)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "FAIL: a real node runs containers: run make e2e-node as root")
		os.Exit(1)
	}
	code := m.Run()
	// A node takes its processes, mounts, cgroups and files away; a test
	// that left any behind fails the run.
	if left := realnode.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left behind: %v\n", left)
		code = 1
	}
	os.Exit(code)
}

// repoRoot is the repository's top directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
