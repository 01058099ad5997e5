package harness

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-dra-plugin/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cri/critest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// NodeOptions describe a simulated GPU node.
type NodeOptions struct {
	Name string
	// Preset (or NodeTopology file) the plugin simulates.
	Preset string
	// Config is the node configuration (NodeConfig YAML); empty: defaults.
	Config string
	// PluginArgs are extra arguments of the plugin command.
	PluginArgs []string
	// NoPlugin leaves the plugin stopped at start.
	NoPlugin bool
	// Metrics serves the plugin's metrics on a loopback port
	// (Node.MetricsURL), sampling the GPUs' processes every 100 ms.
	Metrics bool
	// GPUUse runs simulated workloads: a process on each GPU of each
	// container that has seats, in the container's cgroup, using what
	// GPUUse says (see workload.go). nil: no processes. AddNode takes it:
	// setting Node.Options.GPUUse later changes nothing.
	GPUUse GPUUse
}

// Node is a simulated GPU node: a Node object, the kubelet's DRA manager
// and plugin manager on the node's own directories, a minimal kubelet loop
// that prepares the pods bound to the node as the kubelet does, and the
// driver's plugin command.
type Node struct {
	Name    string
	Options NodeOptions
	NodeFiles
	// MetricsURL is the plugin's /metrics with NodeOptions.Metrics.
	MetricsURL string
	// PluginLog collects the plugin's output.
	PluginLog *SyncBuffer

	c           *Cluster
	dra         *dra.Manager
	stopKubelet func()
	runtime     *critest.Server

	mu          sync.Mutex
	plugin      *pluginRun
	prepared    map[types.UID]*v1.Pod
	containers  map[types.UID]map[string]*Container
	failures    map[types.UID]error
	lister      func() ([]*v1.Pod, error)
	procs       processTable
	metricsAddr string
}

// NodeFiles are a node's directories and files, as the kubelet and the
// plugin see them: the plugin's flags name them (pluginArgs).
type NodeFiles struct {
	// DevicePluginDir is where the plugin looks for a live device-plugin
	// shim: the node's own, so that a shim running on the test machine
	// changes nothing.
	RegistryDir, PluginsDir, DevicePluginDir, CDIDir, StateDir, BootIDFile string
	// FaultsFile is the plugin's fault-injection file
	// (--simulate-faults-file); InjectFault appends to it.
	FaultsFile string
	// ProcessesFile describes the processes on the simulated GPUs
	// (--simulate-processes-file); see workload.go.
	ProcessesFile string
	// PodResourcesSocket is the kubelet's PodResources API; RuntimeSocket
	// the container runtime's CRI API (its ListContainers, over the
	// node's running containers); HostProc the host's procfs as far as
	// the plugin reads it (the simulated processes' mounts).
	PodResourcesSocket, RuntimeSocket, HostProc string
}

type pluginRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	code   int
}

// AddNode creates a node, starts its kubelet parts and its plugin, and
// waits until the plugin is registered and its ResourceSlices published.
func (c *Cluster) AddNode(opts NodeOptions) *Node {
	tb := c.tb
	tb.Helper()
	dir := filepath.Join(c.Dir, "nodes", opts.Name)
	files := NodeFiles{
		RegistryDir:        filepath.Join(dir, "plugins_registry"),
		PluginsDir:         filepath.Join(dir, "plugins"),
		DevicePluginDir:    filepath.Join(dir, "device-plugins"),
		CDIDir:             filepath.Join(dir, "cdi"),
		StateDir:           filepath.Join(dir, "kubelet"),
		BootIDFile:         filepath.Join(dir, "boot_id"),
		FaultsFile:         filepath.Join(dir, "faults"),
		ProcessesFile:      filepath.Join(dir, "processes"),
		PodResourcesSocket: filepath.Join(dir, "pod-resources", "kubelet.sock"),
		RuntimeSocket:      filepath.Join(dir, "containerd.sock"),
		HostProc:           filepath.Join(dir, "proc"),
	}
	n := &Node{
		Name: opts.Name, Options: opts, c: c, NodeFiles: files,
		PluginLog:  &SyncBuffer{},
		prepared:   map[types.UID]*v1.Pod{},
		containers: map[types.UID]map[string]*Container{},
		failures:   map[types.UID]error{},
	}
	n.procs = processTable{file: files.ProcessesFile, hostProc: files.HostProc, use: opts.GPUUse, gpuUUID: n.GPUUUID, pids: map[procKey]uint32{}, nextPID: 4000}
	for _, d := range []string{n.RegistryDir, n.PluginsDir, n.CDIDir, n.StateDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			tb.Fatal(err)
		}
	}
	n.SetBootID("boot-1")
	if opts.Metrics {
		addr, err := freeAddress()
		if err != nil {
			tb.Fatal(err)
		}
		n.metricsAddr, n.MetricsURL = addr, "http://"+addr+"/metrics"
	}
	if opts.Config != "" {
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(opts.Config), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	n.createNodeObject()
	n.runtime = critest.Start(tb, n.RuntimeSocket)
	n.stopKubelet = n.startKubelet()
	tb.Cleanup(func() {
		n.stopKubelet()
		n.StopPlugin()
	})
	c.Nodes = append(c.Nodes, n)
	if !opts.NoPlugin {
		n.StartPlugin()
		n.WaitForPlugin()
	}
	return n
}

// SetBootID writes the node's boot ID (a reboot changes it).
func (n *Node) SetBootID(id string) {
	if err := os.WriteFile(n.BootIDFile, []byte(id+"\n"), 0o644); err != nil {
		n.c.tb.Fatal(err)
	}
}

func (n *Node) createNodeObject() {
	if err := CreateReadyNode(n.c.Ctx, n.c.Client, n.Name, map[string]string{"nvidia.com/gpu.present": "true"}); err != nil {
		n.c.tb.Fatal(err)
	}
}

// CreateReadyNode creates a Node object named name, labelled with its
// hostname and labels, untainted and Ready, with room for any pod that
// requests no more than 64 CPUs and 512Gi: what the scheduler needs of a
// node where no kubelet reports one.
func CreateReadyNode(ctx context.Context, client kubernetes.Interface, name string, labels map[string]string) error {
	l := map[string]string{"kubernetes.io/hostname": name}
	maps.Copy(l, labels)
	node, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	// TaintNodesByCondition marks a new node not-ready; no node controller
	// runs here to lift it.
	node.Spec.Taints = nil
	if node, err = client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("untaint node %s: %w", name, err)
	}
	capacity := v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi"), v1.ResourcePods: resource.MustParse("110"),
	}
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity
	node.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s ready: %w", name, err)
	}
	return nil
}

type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

// RestartKubelet stops the node's kubelet parts (DRA manager, plugin
// manager, pod loop) and starts new ones on the same directories, as a
// kubelet restart does; the plugin keeps running and registers again.
func (n *Node) RestartKubelet() {
	n.stopKubelet()
	n.mu.Lock()
	n.lister = nil
	n.mu.Unlock()
	n.stopKubelet = n.startKubelet()
}

func (n *Node) startKubelet() (stop func()) {
	tb, client := n.c.tb, n.c.Client
	ctx, cancel := context.WithCancel(n.c.Ctx)
	logger := klog.FromContext(ctx).WithValues("node", n.Name)
	ctx = klog.NewContext(ctx, logger)
	mgr, err := dra.NewManager(logger, client, n.StateDir)
	if err != nil {
		tb.Fatalf("node %s: DRA manager: %v", n.Name, err)
	}
	inf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.Name).String()
	}))
	pods := inf.Core().V1().Pods()
	n.mu.Lock()
	n.lister = func() ([]*v1.Pod, error) { return pods.Lister().List(labelsEverything()) }
	n.mu.Unlock()
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	}
	if err := mgr.Start(ctx, n.activePods, getNode, allReady{}); err != nil {
		tb.Fatal(err)
	}
	n.dra = mgr
	stopPodResources, err := n.servePodResources(ctx, mgr)
	if err != nil {
		tb.Fatal(err)
	}
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		n.forwardHealth(ctx)
	}()
	pm := pluginmanager.NewPluginManager(n.RegistryDir, &record.FakeRecorder{})
	pm.AddHandler(pluginwatcherapi.DRAPlugin, mgr.GetWatcherHandler())
	go pm.Run(ctx, allReady{}, ctx.Done())

	queue := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 5*time.Second))
	enqueue := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if p, ok := obj.(*v1.Pod); ok {
			n.mu.Lock()
			if _, known := n.prepared[p.UID]; known && p.DeletionTimestamp == nil {
				n.prepared[p.UID] = p
			}
			n.mu.Unlock()
			queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		}
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		tb.Fatalf("node %s: watch the pods: %v", n.Name, err)
	}
	inf.Start(ctx.Done())
	inf.WaitForCacheSync(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			key, quit := queue.Get()
			if quit {
				return
			}
			if err := n.sync(ctx, key); err != nil {
				logger.V(2).Info("Pod sync failed, retrying", "pod", key, "err", err)
				queue.AddRateLimited(key)
			} else {
				queue.Forget(key)
			}
			queue.Done(key)
		}
	}()
	return func() {
		queue.ShutDown()
		<-done
		cancel()
		<-healthDone
		stopPodResources()
		mgr.Stop()
		inf.Shutdown()
	}
}

// activePods are the pods the kubelet still runs: bound here, not finished.
func (n *Node) activePods() []*v1.Pod {
	n.mu.Lock()
	lister := n.lister
	n.mu.Unlock()
	if lister == nil {
		return nil
	}
	all, err := lister()
	if err != nil {
		return nil
	}
	var out []*v1.Pod
	for _, p := range all {
		if p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			out = append(out, p)
		}
	}
	n.mu.Lock()
	for uid, p := range n.prepared {
		found := false
		for _, q := range out {
			found = found || q.UID == uid
		}
		if !found {
			out = append(out, p)
		}
	}
	n.mu.Unlock()
	return out
}

// pluginArgs are the plugin command's arguments on this node: the same
// command as bin/kyb-dra-plugin, on the node's directories.
func (n *Node) pluginArgs() []string {
	args := []string{
		"--node-name", n.Name,
		"--kubeconfig", n.c.Kubeconfig,
		"--simulate", n.Options.Preset,
		"--cdi-root", n.CDIDir,
		"--kubelet-registrar-directory-path", n.RegistryDir,
		"--kubelet-plugins-directory-path", n.PluginsDir,
		"--device-plugin-directory-path", n.DevicePluginDir,
		"--boot-id-file", n.BootIDFile,
		"--simulate-faults-file", n.FaultsFile,
		"--kube-api-qps", "100", "--kube-api-burst", "200", "--kube-api-background-qps", "100", "--kube-api-background-burst", "200",
		"--simulate-processes-file", n.ProcessesFile,
		"--pod-resources-socket", n.PodResourcesSocket,
		"--container-runtime-socket", n.RuntimeSocket,
		"--host-proc", n.HostProc,
	}
	if n.metricsAddr != "" {
		args = append(args, "--metrics-address", n.metricsAddr, "--gpu-usage-interval", "100ms")
	}
	if n.Options.Config != "" {
		args = append(args, "--config", filepath.Join(filepath.Dir(n.RegistryDir), "config.yaml"))
	}
	return append(args, n.Options.PluginArgs...)
}

// StartPlugin runs the plugin command in this process.
func (n *Node) StartPlugin() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.plugin != nil {
		n.c.tb.Fatalf("node %s: plugin already running", n.Name)
	}
	ctx, cancel := context.WithCancel(n.c.Ctx)
	run := &pluginRun{cancel: cancel, done: make(chan struct{})}
	args := n.pluginArgs()
	go func() {
		defer close(run.done)
		run.code = app.Run(ctx, args, func(string) string { return "" }, n.PluginLog, n.PluginLog)
	}()
	n.plugin = run
}

// StopPlugin stops the plugin as SIGTERM does, and waits for it.
func (n *Node) StopPlugin() {
	n.mu.Lock()
	run := n.plugin
	n.plugin = nil
	n.mu.Unlock()
	if run == nil {
		return
	}
	run.cancel()
	<-run.done
}

// PluginExited reports whether the plugin stopped on its own, and its exit code.
func (n *Node) PluginExited() (bool, int) {
	n.mu.Lock()
	run := n.plugin
	n.mu.Unlock()
	if run == nil {
		return false, 0
	}
	select {
	case <-run.done:
		return true, run.code
	default:
		return false, 0
	}
}

// WaitForPlugin waits until the kubelet has registered the plugin and the
// node's ResourceSlices are published.
func (n *Node) WaitForPlugin() {
	tb := n.c.tb
	tb.Helper()
	pm := n.dra.GetWatcherHandler().(*draplugin.DRAPluginManager)
	err := wait.PollUntilContextTimeout(n.c.Ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if exited, code := n.PluginExited(); exited {
			return false, fmt.Errorf("plugin exited with code %d:\n%s", code, n.PluginLog.Tail(40))
		}
		if _, err := pm.GetPlugin(driver.Name); err != nil {
			return false, nil
		}
		// Every slice of the pool must be accepted, not just some.
		slices, err := n.c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		return err == nil && len(slices.Items) > 0 && int64(len(slices.Items)) == slices.Items[0].Spec.Pool.ResourceSliceCount, nil
	})
	if err != nil {
		tb.Fatalf("node %s: plugin not ready: %v\nplugin log:\n%s", n.Name, err, n.PluginLog.Tail(40))
	}
}

// SyncBuffer is a goroutine-safe log buffer.
type SyncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail returns the last n lines.
func (b *SyncBuffer) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var _ io.Writer = (*SyncBuffer)(nil)

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// InjectFault appends a line to the node's fault-injection file, such as
// "xid 2 79": the running plugin's simulated NVML delivers it (see
// simnode.FaultsFileFormat).
func (n *Node) InjectFault(line string) {
	f, err := os.OpenFile(n.FaultsFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		n.c.tb.Fatalf("node %s: open the faults file: %v", n.Name, err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		n.c.tb.Fatalf("node %s: write the faults file: %v", n.Name, err)
	}
}

// GPUUUID returns the UUID of GPU i of this simulated node, as the plugin
// discovers it (simulated UUIDs derive from the node name).
func (n *Node) GPUUUID(i int) string {
	return simnode.DeriveUUID(n.Name, i)
}

// DRAManager is the node's kubelet DRA manager, for callers that drive
// PrepareResources and UnprepareResources themselves (the benchmarks).
func (n *Node) DRAManager() *dra.Manager { return n.dra }

// RESTConfig is a copy of the admin REST config with the given client-side
// rate limits, for clients that must be throttled like a node component.
func (c *Cluster) RESTConfig(qps float32, burst int) *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = qps, burst
	return cfg
}
