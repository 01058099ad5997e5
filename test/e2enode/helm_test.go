package e2enode

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// The chart's release in the tests, in the namespace the README installs
// into.
const (
	helmNamespace = "kyb-system"
	helmRelease   = "kyb"
)

// helmNode is a real node on a pod network, joined to a cluster that runs
// kube-controller-manager (DaemonSets, garbage collection, ServiceAccounts)
// with RBAC on, and the driver's image imported into its containerd: what
// `helm install` of the chart needs, and nothing of the driver yet.
type helmNode struct {
	c   *harness.Cluster
	n   *realnode.Node
	img realnode.ProductImage
	// helm is the real helm (make helm); home its state directories.
	helm, home string
	// values points the chart at the node's directories (nodeValues).
	values string
}

// startHelmNode starts the cluster and the node, imports the image and
// makes the namespace, labelled as the chart's README says.
func startHelmNode(t *testing.T, opts realnode.Options) *helmNode {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Fatal("HELM is not set: run these tests with make e2e-node, which builds helm (make helm) and passes its path")
	}
	img, err := realnode.ProductImageFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	nw := realnode.NewNetwork(t)
	c := harness.Start(t, harness.Options{
		APIServerAddress:  nw.APIServerAddress,
		ControllerManager: realnode.ControllerManager,
		// RBAC on: the plugin gets what the chart grants and no more.
		// Privileged pods allowed, as kubeadm and kind allow them: the
		// chart's MPS pods are.
		APIServerFlags: []string{"--kubelet-preferred-address-types=InternalIP", "--authorization-mode=Node,RBAC", "--allow-privileged=true"},
	})
	opts.Network, opts.NoPlugin = nw, true
	n := realnode.Start(t, c, tools, opts)
	if err := n.ImportImage(img.Archive); err != nil {
		t.Fatal(err)
	}
	h := &helmNode{c: c, n: n, img: img, helm: helm, home: t.TempDir(), values: filepath.Join(t.TempDir(), "node-values.yaml")}
	if err := os.WriteFile(h.values, []byte(nodeValues(n)), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: helmNamespace, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return h
}

// nodeValues point the chart at the real node's directories: the
// kubelet's root, the CDI directory its containerd reads, containerd's
// configuration for the doctor. Pods of a rolled DaemonSet overlap for
// minReadySeconds: long enough for a claim to be prepared and one
// unprepared meanwhile.
func nodeValues(n *realnode.Node) string {
	return fmt.Sprintf(`kubeletRootDir: %q
cdiRoot: %q
doctor:
  runtimeConfigDirs: [%q]
  containerdConfig: %q
kubeletPlugin:
  minReadySeconds: 20
`, n.RootDir, n.CDIDir, filepath.Dir(n.ContainerdConfig), n.ContainerdConfig)
}

// chart is the chart's directory; example a file of its examples.
func chart() string { return filepath.Join(repoRoot(), "deployments/helm/kyb-dra-driver") }

func example(name string) string { return filepath.Join(chart(), "examples", name) }

// run runs helm against the cluster and returns what it printed.
func (h *helmNode) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(h.helm, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+h.c.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// install runs helm install (or upgrade) of the chart with the values
// files given, the node's values and the --set pairs given.
func (h *helmNode) install(t *testing.T, verb string, files []string, set ...string) string {
	t.Helper()
	args := []string{verb, helmRelease, chart(), "--namespace", helmNamespace}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	args = append(args, "-f", h.values)
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return h.run(t, args...)
}

// pods lists the release's node-agent pods, oldest first: kyb-scheduler's
// pods (scheduler.enabled) are not among them.
func (h *helmNode) pods(t *testing.T) []v1.Pod {
	t.Helper()
	return h.podsOf(t, "app.kubernetes.io/component!=scheduler")
}

// podsOf lists the release's pods that match selector, oldest first.
func (h *helmNode) podsOf(t *testing.T, selector string) []v1.Pod {
	t.Helper()
	if selector != "" {
		selector = "," + selector
	}
	l, err := h.c.Client.CoreV1().Pods(helmNamespace).List(h.c.Ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + helmRelease + selector})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(l.Items, func(a, b v1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	return l.Items
}

// waitForAgent waits until the release runs exactly one pod on the node,
// other than those in not, and it is Ready, and returns it.
func (h *helmNode) waitForAgent(t *testing.T, timeout time.Duration, not ...string) v1.Pod {
	t.Helper()
	var pod v1.Pod
	var seen []v1.Pod
	err := wait.PollUntilContextTimeout(h.c.Ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		seen = h.pods(t)
		var ready []v1.Pod
		for _, p := range seen {
			if !slices.Contains(not, p.Name) && p.DeletionTimestamp == nil && podReady(&p) {
				ready = append(ready, p)
			}
		}
		if len(ready) == 1 && len(seen) == 1 {
			pod = ready[0]
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		var why []string
		for _, p := range seen {
			why = append(why, fmt.Sprintf("%s: %s %s", p.Name, h.c.DescribePod(helmNamespace, p.Name), h.log(t, p.Name, "doctor", true)))
		}
		t.Fatalf("the release's pod is not the only one, Ready, after %v:\n%s\n%s", timeout, podTable(seen), strings.Join(why, "\n"))
	}
	return pod
}

// waitRolledOut waits until the release's DaemonSet has rolled out, as
// kubectl rollout status says it: every node runs an updated pod that has
// been available (Ready for minReadySeconds). A rollout started before the
// last one is done may wait on the DaemonSet controller: it looks again
// minReadySeconds after an event, and one look can come too early for the
// new pod and too late for the old.
func (h *helmNode) waitRolledOut(t *testing.T, timeout time.Duration) {
	t.Helper()
	var ds *appsv1.DaemonSet
	err := wait.PollUntilContextTimeout(h.c.Ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := h.c.Client.AppsV1().DaemonSets(helmNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + helmRelease})
		if err != nil || len(l.Items) != 1 {
			return false, nil
		}
		ds = &l.Items[0]
		s := ds.Status
		return s.ObservedGeneration >= ds.Generation && s.DesiredNumberScheduled > 0 &&
			s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberAvailable == s.DesiredNumberScheduled, nil
	})
	if err != nil {
		t.Fatalf("the DaemonSet has not rolled out after %v: status %+v\n%s", timeout, ds.Status, podTable(h.pods(t)))
	}
}

func podReady(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// log returns a container's log, or the error reading it when quiet.
func (h *helmNode) log(t *testing.T, pod, container string, quiet bool) string {
	t.Helper()
	b, err := h.c.Client.CoreV1().Pods(helmNamespace).GetLogs(pod, &v1.PodLogOptions{Container: container}).DoRaw(h.c.Ctx)
	if err != nil {
		if quiet {
			return fmt.Sprintf("(log of %s/%s: %v)", pod, container, err)
		}
		t.Fatalf("log of %s container %s: %v", pod, container, err)
	}
	return string(b)
}

// configMap returns the node configuration the release's ConfigMap holds.
func (h *helmNode) configMap(t *testing.T) string {
	t.Helper()
	cm, err := h.c.Client.CoreV1().ConfigMaps(helmNamespace).Get(h.c.Ctx, helmRelease+"-kyb-dra-driver-config", metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return cm.Data["config.yaml"]
}

// podTable prints pods as kubectl get pods -o wide does.
func podTable(pods []v1.Pod) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "NAME\tREADY\tSTATUS\tRESTARTS\tAGE\tIP\tNODE")
	for _, p := range pods {
		var ready, restarts int
		for _, s := range p.Status.ContainerStatuses {
			if s.Ready {
				ready++
			}
			restarts += int(s.RestartCount)
		}
		status := string(p.Status.Phase)
		if p.DeletionTimestamp != nil {
			status = "Terminating"
		}
		fmt.Fprintf(w, "%s\t%d/%d\t%s\t%d\t%s\t%s\t%s\n", p.Name, ready, len(p.Spec.Containers), status, restarts,
			time.Since(p.CreationTimestamp.Time).Round(time.Second), p.Status.PodIP, p.Spec.NodeName)
	}
	_ = w.Flush()
	return b.String()
}

// scrapeMetrics reads the plugin's /metrics at its pod IP, as Prometheus
// does from the pod network.
func scrapeMetrics(t *testing.T, pod v1.Pod) string {
	t.Helper()
	var body string
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		resp, err := http.Get(fmt.Sprintf("http://%s:8080/metrics", pod.Status.PodIP))
		if err != nil {
			return false, nil
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("metrics of pod %s at %s:8080: %v", pod.Name, pod.Status.PodIP, err)
	}
	return body
}

// waitForScheduler waits until the release's kyb-scheduler runs one Ready
// pod that holds the leader lease, and returns the pod.
func (h *helmNode) waitForScheduler(t *testing.T, timeout time.Duration) v1.Pod {
	t.Helper()
	var pod v1.Pod
	var seen []v1.Pod
	var holder string
	err := wait.PollUntilContextTimeout(h.c.Ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		seen = h.podsOf(t, "app.kubernetes.io/component=scheduler")
		if len(seen) != 1 || !podReady(&seen[0]) {
			return false, nil
		}
		pod = seen[0]
		lease, err := h.c.Client.CoordinationV1().Leases(helmNamespace).Get(ctx, "kyb-scheduler", metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *lease.Spec.HolderIdentity
		return strings.HasPrefix(holder, pod.Name), nil
	})
	if err != nil {
		var why []string
		for _, p := range seen {
			why = append(why, fmt.Sprintf("%s: %s\n%s", p.Name, h.c.DescribePod(helmNamespace, p.Name), h.log(t, p.Name, "kyb-scheduler", true)))
		}
		t.Fatalf("kyb-scheduler has no Ready pod holding its lease after %v (holder %q):\n%s\n%s", timeout, holder, podTable(seen), strings.Join(why, "\n"))
	}
	return pod
}

// scheduledBy is the component that reported pod's Scheduled event.
func scheduledBy(t *testing.T, c *harness.Cluster, pod string) string {
	t.Helper()
	var by string
	waitUntil(t, "pod "+pod+"'s Scheduled event", 30*time.Second, func() bool {
		l, err := c.Client.CoreV1().Events("default").List(c.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=Scheduled"})
		if err != nil || len(l.Items) == 0 {
			return false
		}
		by = l.Items[0].ReportingController
		if by == "" {
			by = l.Items[0].Source.Component
		}
		return true
	})
	return by
}
