package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// Tools are the programs a node runs: the node's own (hack/node-tools.sh)
// and the driver's binaries (make build).
type Tools struct {
	// Dir holds containerd, ctr, containerd-shim-runc-v2, kubelet,
	// kube-proxy, pause and busybox.
	Dir string
	// Bin holds kyb-dra-plugin, kyb-device-plugin and kyb-cuda-probe.
	Bin string
}

// ToolsFromEnv reads the tools' directories from KYB_NODE_TOOLS and
// KYB_BIN, as make e2e-node sets them, and checks that they are there.
func ToolsFromEnv() (Tools, error) {
	t := Tools{Dir: os.Getenv("KYB_NODE_TOOLS"), Bin: os.Getenv("KYB_BIN")}
	if t.Dir == "" || t.Bin == "" {
		return t, fmt.Errorf("KYB_NODE_TOOLS and KYB_BIN are not set: run these tests with make e2e-node")
	}
	if err := lookTools(t.Dir, "containerd", "ctr", "containerd-shim-runc-v2", "kubelet", "kube-proxy", "pause", "busybox"); err != nil {
		return t, fmt.Errorf("node tools (make e2e-node builds them): %w", err)
	}
	if err := lookTools(t.Bin, "kyb-dra-plugin", "kyb-device-plugin", "kyb-cuda-probe"); err != nil {
		return t, fmt.Errorf("driver binaries (make build): %w", err)
	}
	return t, nil
}

// Options describe a real node.
type Options struct {
	Name string
	// Preset the plugin simulates.
	Preset string
	// Config is the node configuration (NodeConfig YAML); empty: defaults.
	Config string
	// PluginArgs are extra arguments of the plugin.
	PluginArgs []string
	// DriverRoot, when set, is the NVIDIA driver's root for the plugin
	// (--driver-files=driver-root): containers get its libraries.
	DriverRoot string
	// Shim runs kyb-device-plugin instead of the DRA plugin: the kubelet's
	// device manager serves the seats as extended resources.
	Shim bool
	// ImageFiles are more files of the workload image: its path (no
	// leading slash) to the host file.
	ImageFiles map[string]string
	// Network, when set, gives pods that do not use the host's network an
	// address on it (CNI) and runs kube-proxy: pods reach the API server
	// at the "kubernetes" Service. The cluster must serve pods at its
	// APIServerAddress.
	Network *Network
	// NoPlugin starts no plugin of the driver as a process of the node:
	// something else brings it, such as the chart's DaemonSet. Start
	// returns once the node is Ready.
	NoPlugin bool
}

// KubeletDevicePluginDir is where the kubelet's device manager listens
// and device plugins put their sockets: fixed in the kubelet, whatever
// its root directory. So one real node at a time runs on a machine.
const KubeletDevicePluginDir = "/var/lib/kubelet/device-plugins"

// Node is a real node: containerd, the kubelet and the driver's plugin,
// each its own process, all under Dir.
type Node struct {
	Name    string
	Options Options
	// Dir holds everything of the node; RootDir is the kubelet's.
	Dir, RootDir, CDIDir string
	// containerd is the node's container runtime (containerd.go), and
	// the images it holds (images.go).
	*containerd

	c                          *harness.Cluster
	tools                      Tools
	cgroupRoot                 string
	kubeletPort                int
	kubelet, plugin, kubeProxy *process
}

// Start starts a real node joined to the cluster: containerd with the
// node's images, the driver's DRA plugin (unless Options.NoPlugin), the
// kubelet and, on a Network, kube-proxy; it returns once the node is Ready
// and the plugin has published its slices. Everything stops and goes when
// tb cleans up.
func Start(tb ktesting.TB, c *harness.Cluster, tools Tools, opts Options) *Node {
	tb.Helper()
	started := time.Now()
	// Short: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "kyb-node-")
	if err != nil {
		tb.Fatal(err)
	}
	n := &Node{
		Name: opts.Name, Options: opts, Dir: dir, c: c, tools: tools,
		RootDir:    filepath.Join(dir, "kubelet"),
		CDIDir:     filepath.Join(dir, "cdi"),
		cgroupRoot: "/" + filepath.Base(dir),
	}
	tb.Cleanup(func() {
		if !tb.Failed() {
			_ = os.RemoveAll(dir)
			return
		}
		// Keep the logs of a failed test; the rest goes.
		keep := filepath.Join(os.TempDir(), "kyb-node-logs-"+opts.Name)
		_ = os.RemoveAll(keep)
		_ = os.MkdirAll(keep, 0o755)
		for _, f := range []string{"containerd.log", "kubelet.log", "plugin.log", "kube-proxy.log"} {
			_ = os.Rename(filepath.Join(dir, f), filepath.Join(keep, f))
		}
		tb.Logf("logs of node %s kept in %s", opts.Name, keep)
		_ = os.RemoveAll(dir)
	})
	for _, d := range []string{n.RootDir, n.CDIDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	if err := makeCgroupRoot(n.cgroupRoot); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { removeCgroupRoot(n.cgroupRoot) })
	if opts.Config != "" {
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(opts.Config), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	// Its cleanup runs after the kubelet's and the shim's.
	n.claimDevicePluginDir(tb)
	n.startContainerd(tb)
	// Registered after containerd's cleanup, so it runs before it: the
	// pods go first, through the kubelet and the plugin, as a drained
	// node's do.
	tb.Cleanup(func() {
		n.drain(tb)
		n.StopKubelet()
		n.plugin.stop(10 * time.Second)
		n.stopKubeProxy()
	})
	if !opts.NoPlugin {
		n.StartPlugin(tb)
	}
	n.startKubelet(tb)
	if opts.Network != nil {
		n.startKubeProxy(tb)
	}
	switch {
	case opts.NoPlugin:
	case opts.Shim:
		n.WaitForResources(tb)
	default:
		n.waitForSlices(tb)
	}
	tb.Logf("real node %s up in %v (dir %s)", n.Name, time.Since(started).Round(time.Millisecond), dir)
	return n
}

// drain deletes every pod bound to the node and waits until the kubelet
// has stopped them, so that their claims are unprepared by the plugin.
// The cluster's controllers stop first: a DaemonSet would put its pod
// back.
func (n *Node) drain(tb ktesting.TB) {
	n.c.StopControllerManager()
	pods, err := n.c.Client.CoreV1().Pods("").List(n.c.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		_ = n.c.Client.CoreV1().Pods(p.Namespace).Delete(n.c.Ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		pods, err := n.c.Client.CoreV1().Pods("").List(n.c.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil || len(pods.Items) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	tb.Logf("node %s: pods still there after 60s", n.Name)
}

// pluginArgs point the plugin (or the shim) at the kubelet's directories
// on this node.
func (n *Node) pluginArgs() []string {
	args := []string{
		"--node-name", n.Name,
		"--simulate", n.Options.Preset,
		"--cdi-root", n.CDIDir,
		"--kubelet-plugins-directory-path", filepath.Join(n.RootDir, "plugins"),
		"--device-plugin-directory-path", KubeletDevicePluginDir,
		"-v", "2",
	}
	// The kubelet serves its PodResources API under its root directory.
	args = append(args, "--pod-resources-socket", filepath.Join(n.RootDir, "pod-resources", "kubelet.sock"))
	if !n.Options.Shim {
		args = append(args,
			"--container-runtime-socket", n.ContainerdSocket,
			"--kubeconfig", n.c.Kubeconfig,
			"--kubelet-registrar-directory-path", filepath.Join(n.RootDir, "plugins_registry"),
			"--boot-id-file", filepath.Join(n.Dir, "boot_id"))
	}
	if n.Options.Config != "" {
		args = append(args, "--config", filepath.Join(n.Dir, "config.yaml"))
	}
	if n.Options.DriverRoot != "" {
		args = append(args, "--driver-root", n.Options.DriverRoot, "--driver-files", "driver-root")
	}
	return append(args, n.Options.PluginArgs...)
}

// StartPlugin starts the driver's DRA plugin on the node, or the
// device-plugin shim on a shim node.
func (n *Node) StartPlugin(tb ktesting.TB) {
	tb.Helper()
	if _, err := os.Stat(filepath.Join(n.Dir, "boot_id")); err != nil {
		if err := os.WriteFile(filepath.Join(n.Dir, "boot_id"), []byte("boot-1\n"), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	name := "kyb-dra-plugin"
	if n.Options.Shim {
		name = "kyb-device-plugin"
	}
	p, err := startProcess(name, filepath.Join(n.Dir, "plugin.log"), nil,
		filepath.Join(n.tools.Bin, name), n.pluginArgs()...)
	if err != nil {
		tb.Fatal(err)
	}
	n.plugin = p
}

// StopPlugin stops the plugin as a rolling update does (SIGTERM).
func (n *Node) StopPlugin() { n.plugin.stop(30 * time.Second) }

// KillPlugin ends the plugin at once, as a crash does.
func (n *Node) KillPlugin() { n.plugin.kill() }

// PluginLog returns the plugin's output so far.
func (n *Node) PluginLog() string { return tail(filepath.Join(n.Dir, "plugin.log"), 1<<20) }

// waitForSlices waits until the plugin has published slices for the node.
func (n *Node) waitForSlices(tb ktesting.TB) {
	tb.Helper()
	waitFor(tb, "ResourceSlices of node "+n.Name, n.plugin, 60*time.Second, func() bool {
		l, err := n.c.Client.ResourceV1().ResourceSlices().List(n.c.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		return err == nil && len(l.Items) > 0
	})
}

// mount is one line of /proc/self/mountinfo.
type mount struct{ point, fsType string }

func mounts() ([]mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mount
	for _, line := range strings.Split(string(data), "\n") {
		// The filesystem type follows the " - " separator.
		head, tail, ok := strings.Cut(line, " - ")
		fields, rest := strings.Fields(head), strings.Fields(tail)
		if ok && len(fields) > 4 && len(rest) > 0 {
			out = append(out, mount{point: fields[4], fsType: rest[0]})
		}
	}
	return out, nil
}

// mountsUnder returns the mount points at or under dir.
func mountsUnder(dir string) []string {
	all, _ := mounts()
	var out []string
	for _, m := range all {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	return out
}

// cgroupMounts returns the mount points of the machine's cgroup
// hierarchies (v1: one per controller set; v2: one).
func cgroupMounts() ([]string, error) {
	all, err := mounts()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range all {
		if m.fsType == "cgroup" || m.fsType == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out, nil
}

type proc struct {
	pid     int
	cmdline string
}

// processesUnder returns the processes, other than this one, whose
// command line names dir.
func processesUnder(dir string) []proc {
	entries, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), dir) {
			out = append(out, proc{pid: pid, cmdline: strings.ReplaceAll(string(cmdline), "\x00", " ")})
		}
	}
	return out
}

// makeCgroupRoot creates the node's cgroup root in every hierarchy: the
// kubelet refuses a root that does not exist.
func makeCgroupRoot(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return fmt.Errorf("cgroup mounts: %w", err)
	}
	for _, m := range mounts {
		if err := os.MkdirAll(filepath.Join(m, root), 0o755); err != nil {
			return fmt.Errorf("cgroup root: %w", err)
		}
	}
	return nil
}

// removeCgroupRoot removes the node's cgroups, deepest first; a cgroup
// with a process left in it stays (and says so in the test's log only).
func removeCgroupRoot(root string) {
	mounts, _ := cgroupMounts()
	for _, m := range mounts {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(m, root), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

// Leftovers lists what nodes left on the machine: their directories,
// mounts, cgroups and processes. Empty after every node's cleanup.
func Leftovers() []string {
	prefix := filepath.Join(os.TempDir(), "kyb-node-")
	out, _ := filepath.Glob(prefix + "[0-9]*")
	for _, m := range mountsUnder(filepath.Dir(prefix)) {
		if strings.HasPrefix(m, prefix) {
			out = append(out, "mount "+m)
		}
	}
	if cgroups, err := cgroupMounts(); err == nil {
		for _, m := range cgroups {
			left, _ := filepath.Glob(filepath.Join(m, "kyb-node-[0-9]*"))
			out = append(out, left...)
		}
	}
	for _, p := range processesUnder(prefix) {
		out = append(out, fmt.Sprintf("process %d: %s", p.pid, p.cmdline))
	}
	out = append(out, networkLeftovers()...)
	return append(out, devicePluginFiles()...)
}
