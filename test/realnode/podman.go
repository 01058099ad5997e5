package realnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/kubernetes/test/utils/ktesting"
)

// Podman runs a container with podman (a second runtime, Debian's) from
// the node's busybox image, with the given CDI devices from the node's
// spec directory, and returns what it printed. Podman 4.3 reads specs
// from /etc/cdi and /run/cdi only, so it runs in a mount namespace of its
// own where /run is an empty tmpfs with the node's spec directory at
// /run/cdi: the machine's own directories are not touched.
func (n *Node) Podman(tb ktesting.TB, cdiDevices []string, command string) string {
	tb.Helper()
	dir := filepath.Join(n.Dir, "podman")
	global := []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--tmpdir", filepath.Join(dir, "tmp"),
		"--cgroup-manager", "cgroupfs", "--events-backend", "file", "--storage-driver", "vfs"}
	if _, err := os.Stat(dir); err != nil {
		archive := filepath.Join(n.Dir, "busybox-podman.tar")
		img, err := n.busyboxImage()
		if err != nil {
			tb.Fatal(err)
		}
		if err := img.writeArchive(archive); err != nil {
			tb.Fatal(err)
		}
		if out, err := exec.Command("podman", append(global, "load", "-i", archive)...).CombinedOutput(); err != nil {
			tb.Fatalf("podman load: %v\n%s", err, out)
		}
	}
	// The machine has no CAP_SYS_RESOURCE: podman's default ulimits
	// (above the hard limits) would fail the container's start.
	run := append(append([]string{}, global...), "run", "--rm", "--network", "none",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
	for _, d := range cdiDevices {
		run = append(run, "--device", d)
	}
	// The image's entrypoint is /bin/sh.
	run = append(run, BusyboxImage, "-c", command)
	script := fmt.Sprintf("mount -t tmpfs tmpfs /run && mkdir /run/cdi && mount --bind %s /run/cdi && exec podman %s",
		shellQuote(n.CDIDir), strings.Join(quoteAll(run), " "))
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		tb.Fatalf("podman run %v: %v\n%s", cdiDevices, err, out)
	}
	return string(out)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func quoteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = shellQuote(a)
	}
	return out
}
