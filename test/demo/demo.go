// Package demo runs the local demo: a simulated cluster in this process
// (the end-to-end harness), the driver's plugin on each simulated GPU node,
// the DeviceClasses, and the specs under demo/specs; then it shows what a
// user wants to see: the ResourceSlices, the seats of each group, where
// each pod landed and what each container got.
package demo

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// Options configure the demo.
type Options struct {
	// Presets are the simulated nodes, one per entry (node-1, node-2, ...).
	Presets []string
	// Config is the node configuration file every node uses.
	Config string
	// Classes is the DeviceClasses file.
	Classes string
	// Specs is the directory of the specs to apply, in file-name order.
	Specs string
	// Keep leaves the cluster running until ctx ends.
	Keep bool
	// Kubectl is the path of a kubectl binary to suggest (Keep only).
	Kubectl string
	// LogFile receives etcd's logs (the others go to the log writer).
	LogFile string
}

// Run runs the demo, writing the story to out and the components' logs to
// log. Fatal problems end it with an error.
func Run(ctx context.Context, opts Options, out, log io.Writer) (err error) {
	tb := harness.NewProcessTB(log)
	defer tb.Close()
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(harness.FatalError)
			if !ok {
				panic(r)
			}
			err = fe
		}
	}()
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(out, "  [%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	config, err := os.ReadFile(opts.Config)
	if err != nil {
		return fmt.Errorf("read node configuration: %w", err)
	}
	var nodes []harness.NodeOptions
	for i, p := range opts.Presets {
		nodes = append(nodes, harness.NodeOptions{Name: fmt.Sprintf("node-%d", i+1), Preset: p, Config: string(config), NoPlugin: true,
			Metrics: true, GPUUse: workload})
	}
	fmt.Fprintf(out, "kyb DRA driver demo: %d simulated GPU node(s), node configuration %s\n\n", len(nodes), opts.Config)
	step("starting etcd, kube-apiserver, kube-scheduler and the resource-claim controller")
	c := harness.Start(tb, harness.Options{EtcdLog: opts.LogFile})
	step("control plane up; kubeconfig %s", c.Kubeconfig)
	for _, no := range nodes {
		n := c.AddNode(no)
		n.StartPlugin()
		n.WaitForPlugin()
		step("node %s (%s): kubelet DRA manager running, kyb-dra-plugin registered and publishing", n.Name, no.Preset)
	}
	if _, err := c.ApplyFile(opts.Classes, harness.ApplyOptions{}); err != nil {
		return err
	}
	step("created the DeviceClasses from %s", opts.Classes)
	files, err := filepath.Glob(filepath.Join(opts.Specs, "*.yaml"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	var pods []string
	for _, f := range files {
		objs, err := c.ApplyFile(f, harness.ApplyOptions{})
		if err != nil {
			return err
		}
		var names []string
		for _, o := range objs {
			names = append(names, strings.ToLower(o.GetKind())+"/"+o.GetName())
			if o.GetKind() == "Pod" {
				pods = append(pods, o.GetName())
			}
		}
		step("applied %s: %s", filepath.Base(f), strings.Join(names, ", "))
	}
	settle(ctx, c, pods)
	step("every pod is running or reported unschedulable")
	statusesWritten(ctx, c)
	step("the plugin wrote the seats into the claims' status")
	fmt.Fprintln(out)

	if err := report(ctx, c, pods, out); err != nil {
		return err
	}
	if opts.Keep {
		fmt.Fprintf(out, "\nThe cluster keeps running. In another shell:\n\n  export KUBECONFIG=%s PATH=%s:$PATH\n  %s get resourceslices\n  %s get resourceclaims -o wide\n  %s get pods -o wide\n  %s kyb seats -A\n", c.Kubeconfig, binDir(opts.Kubectl), opts.Kubectl, opts.Kubectl, opts.Kubectl, opts.Kubectl)
		// Faults go through the simulated NVML, so the plugin's real health
		// handling taints the GPU's groups (docs/health.md).
		fmt.Fprintf(out, "\nInject a GPU fault (XID 79 on GPU 0 of %s) and watch its groups get tainted:\n\n  echo 'xid 0 79' >> %s\n  %s get resourceslices -o yaml | grep -B2 -A3 taints\n", c.Nodes[0].Name, c.Nodes[0].FaultsFile, opts.Kubectl)
		fmt.Fprintf(out, "\nEach node's plugin serves its metrics (seats, and each pod's GPU memory and SM use from the simulated workloads):\n\n")
		for _, n := range c.Nodes {
			fmt.Fprintf(out, "  %s %s\n", n.Name, n.MetricsURL)
		}
		fmt.Fprintf(out, "\nPress Ctrl-C to stop it.\n")
		<-ctx.Done()
		fmt.Fprintln(out, "stopping")
	}
	return nil
}

// settle waits until each pod runs or the scheduler gave up on it for now.
func settle(ctx context.Context, c *harness.Cluster, pods []string) {
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, name := range pods {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Status.Phase == v1.PodRunning {
				continue
			}
			if !unschedulable(p) {
				return false, nil
			}
		}
		return true, nil
	})
}

// statusesWritten waits until every allocated claim of the driver carries
// the seat data the plugin writes a second after its prepare, so that the
// seats are known to kubectl kyb seats.
func statusesWritten(ctx context.Context, c *harness.Cluster) {
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		claims, err := c.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, cl := range claims.Items {
			if cl.Status.Allocation == nil || len(cl.Status.ReservedFor) == 0 {
				continue
			}
			ours := 0
			for _, r := range cl.Status.Allocation.Devices.Results {
				if r.Driver == driver.Name {
					ours++
				}
			}
			written := 0
			for _, d := range cl.Status.Devices {
				if d.Driver == driver.Name && d.Data != nil {
					written++
				}
			}
			if written < ours {
				return false, nil
			}
		}
		return true, nil
	})
}

func unschedulable(p *v1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// binDir is the absolute directory of the kubectl binary, where make demo
// puts kubectl-kyb too.
func binDir(kubectl string) string {
	abs, err := filepath.Abs(kubectl)
	if err != nil {
		return filepath.Dir(kubectl)
	}
	return filepath.Dir(abs)
}

// workload is what the demo's simulated workloads use of each GPU their
// seats give them: a steady amount, different from pod to pod, so that the
// per-pod GPU metrics have something to show.
func workload(pod *v1.Pod, container string) (memoryMiB uint64, smPercent uint32, ok bool) {
	h := fnv.New32a()
	h.Write([]byte(pod.Namespace + "/" + pod.Name + "/" + container))
	x := h.Sum32()
	return 2000 + uint64(x%14000), 10 + (x/14000)%70, true
}
