package realnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"k8s.io/kubernetes/test/utils/ktesting"
)

const (
	// Images of every node, imported from local archives: nothing is
	// pulled, pods say imagePullPolicy: Never.
	BusyboxImage = "kyb.local/busybox:e2e"
	PauseImage   = "kyb.local/pause:e2e"
)

// containerdConfig is containerd's configuration for one node. The
// settings beyond CDI are what an unprivileged-enough VM needs: it lacks
// CAP_SYS_RESOURCE, so the pause container may not lower its OOM score,
// and network namespaces stay under the node's directory. Without a
// Network, pods use the host network; the loopback-only CNI configuration
// only lets the runtime report its network ready. cniBin is where the CNI
// plugins are.
func containerdConfig(dir, cdiDir, cniBin string) string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = [%[5]q]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[8]q]
    conf_dir = %[6]q
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %[7]q

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "containerd.sock"),
		filepath.Join(dir, "containerd.ttrpc.sock"), cdiDir, filepath.Join(dir, "cni"), PauseImage, cniBin)
}

const loopbackCNI = `{"cniVersion": "1.0.0", "name": "kyb-loopback", "plugins": [{"type": "loopback"}]}`

// containerd is a node's containerd: its configuration and socket, its
// process, and the images it holds (images.go).
type containerd struct {
	// ContainerdConfig is containerd's configuration file, alone in its
	// directory; ContainerdSocket its gRPC socket.
	ContainerdConfig, ContainerdSocket string
	// node names the node in errors; dir holds everything of it.
	node, dir string
	// ctrPath is containerd's client; cgroupRoot the node's cgroup, under
	// which RunImage's containers run.
	ctrPath, cgroupRoot string
	proc                *process
}

// startContainerd starts containerd for a node and imports its images.
func (n *Node) startContainerd(tb ktesting.TB) {
	tb.Helper()
	dir := filepath.Join(n.Dir, "containerd")
	if err := os.MkdirAll(filepath.Join(dir, "cni"), 0o755); err != nil {
		tb.Fatal(err)
	}
	cni, cniBin := loopbackCNI, filepath.Join(dir, "cni")
	if n.Options.Network != nil {
		cni, cniBin = n.Options.Network.cniConfig(dir), CNIPluginDir
	}
	if err := os.WriteFile(filepath.Join(dir, "cni", "10-kyb.conflist"), []byte(cni), 0o644); err != nil {
		tb.Fatal(err)
	}
	// Apart from containerd's own directories, so that a pod can mount
	// the configuration alone (the chart's doctor reads it).
	conf := filepath.Join(n.Dir, "etc", "containerd", "config.toml")
	if err := os.MkdirAll(filepath.Dir(conf), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte(containerdConfig(dir, n.CDIDir, cniBin)), 0o644); err != nil {
		tb.Fatal(err)
	}
	n.containerd = &containerd{
		ContainerdConfig: conf, ContainerdSocket: filepath.Join(dir, "containerd.sock"),
		node: n.Name, dir: n.Dir, ctrPath: filepath.Join(n.tools.Dir, "ctr"), cgroupRoot: n.cgroupRoot,
	}
	// The shim and runc are found on PATH: the node's tools first.
	env := []string{"PATH=" + n.tools.Dir + ":" + os.Getenv("PATH")}
	p, err := startProcess("containerd", filepath.Join(n.Dir, "containerd.log"), env,
		filepath.Join(n.tools.Dir, "containerd"), "--config", conf, "--log-level", "info")
	if err != nil {
		tb.Fatal(err)
	}
	n.proc = p
	tb.Cleanup(n.clean)
	waitFor(tb, "containerd socket", p, 30*time.Second, func() bool {
		_, err := os.Stat(n.ContainerdSocket)
		return err == nil
	})
	busybox, err := n.busyboxImage()
	if err != nil {
		tb.Fatal(err)
	}
	for _, img := range []image{busybox, pauseImage(PauseImage, filepath.Join(n.tools.Dir, "pause"))} {
		archive := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(img.name)+".tar")
		if err := img.writeArchive(archive); err != nil {
			tb.Fatal(err)
		}
		if out, err := n.ctr("images", "import", "--platform", "linux/amd64", archive); err != nil {
			tb.Fatalf("import %s: %v\n%s", img.name, err, out)
		}
	}
}

// ctr runs containerd's client against the node's containerd, in the
// namespace the kubelet's pods live in.
func (cd *containerd) ctr(args ...string) (string, error) {
	cmd := exec.Command(cd.ctrPath, append([]string{"--address", cd.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// clean stops every container the node ran, containerd, the shims it
// left, and unmounts what they mounted under the node's directory. Pods
// of a stopped kubelet keep running otherwise: the shims are not
// containerd's children.
func (cd *containerd) clean() {
	if cd.proc != nil {
		if out, err := cd.ctr("tasks", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _ = cd.ctr("tasks", "kill", "--signal", "SIGKILL", id)
			}
		}
		cd.proc.stop(10 * time.Second)
	}
	killUnder(cd.dir)
	unmountUnder(cd.dir)
}

// killUnder kills every process whose command line names dir: the shims
// (started with the node's containerd address) and anything they left.
func killUnder(dir string) {
	for _, p := range processesUnder(dir) {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
}

// unmountUnder lazily unmounts every mount point under dir, deepest first.
func unmountUnder(dir string) {
	points := mountsUnder(dir)
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}
