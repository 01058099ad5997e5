package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:kyb-system"]
- level: None
`

// auditEntry is the part of an audit event the test reads.
type auditEntry struct {
	Verb      string                    `json:"verb"`
	User      struct{ Username string } `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// The plugin runs with the chart's ServiceAccount, from a token bound to a
// pod on its node as the DaemonSet's pods get: the chart's RBAC is enough
// for everything it does (the API server's audit log lists each call), and
// the chart's admission policies refuse writes to another node's
// ResourceSlices and claims.
func TestChartRBACIsEnoughAndNodeScoped(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	auditLog := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	c := harness.Start(t, harness.Options{
		// RBAC on (the test server allows everything by default): the
		// plugin gets what the chart grants and no more.
		APIServerFlags: []string{"--authorization-mode=Node,RBAC",
			"--audit-policy-file=" + policy, "--audit-log-path=" + auditLog, "--audit-log-mode=blocking", "--audit-log-format=json"},
		Nodes: []harness.NodeOptions{
			// With the per-pod GPU metrics on, as the chart runs them:
			// each container with a seat runs a process on its GPU.
			{Name: "node-a", Preset: "single-gpu", NoPlugin: true, Metrics: true,
				GPUUse: func(*corev1.Pod, string) (uint64, uint32, bool) { return 1000, 10, true }},
			{Name: "node-b", Preset: "single-gpu"},
		},
	})
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kyb-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	objs, err := c.Apply(helmTemplate(t, "kyb", "kyb-system"), harness.ApplyOptions{Namespace: "kyb-system"})
	if err != nil {
		t.Fatalf("install the chart: %v", err)
	}
	var sa string
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			sa = o.GetName()
		}
	}
	if sa == "" {
		t.Fatal("the chart has no ServiceAccount")
	}

	// A pod of the DaemonSet on node-a, and a token bound to it.
	pod, err := c.Client.CoreV1().Pods("kyb-system").Create(c.Ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kyb-plugin-node-a", Namespace: "kyb-system"},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: sa,
			Containers: []corev1.Container{{Name: "plugin", Image: "registry.k8s.io/pause:3.10"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Client.CoreV1().ServiceAccounts("kyb-system").CreateToken(c.Ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for the plugin's ServiceAccount: %v", err)
	}
	kubeconfig := filepath.Join(dir, "plugin-kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, tr.Status.Token); err != nil {
		t.Fatal(err)
	}

	nodeA := c.Node("node-a")
	nodeA.Options.PluginArgs = []string{"--kubeconfig", kubeconfig}
	nodeA.StartPlugin()
	nodeA.WaitForPlugin()

	// Everything the plugin does, as that ServiceAccount: publish, read a
	// claim, write its status, record an event.
	createTemplate(t, c, "one-1x", class1x)
	createPod(t, c, podSpec{name: "on-a", node: "node-a", claims: fromTemplate("one-1x")})
	p, _, ctrs := c.WaitForPodRunning(t, "default", "on-a", timeout)
	if ctrs["app"].Env["KYB_GPU_GROUP"] != "G0" {
		t.Errorf("env %v", ctrs["app"].Env)
	}
	claimA := waitClaimStatus(t, c, "default", harness.PodClaim(p, "gpu"))
	if len(claimA.Status.Devices) != 1 {
		t.Fatalf("the plugin could not write the seat status with the chart's RBAC: %+v\n%s", claimA.Status.Devices, nodeA.PluginLog.Tail(20))
	}
	// The pod's GPU use is its seat's, found from the node alone: no pod
	// read from the API.
	err = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		for _, s := range scrape(t, nodeA.MetricsURL, "kyb_container_gpu_memory_used_bytes")["kyb_container_gpu_memory_used_bytes"] {
			if s.labels["pod"] == "on-a" && s.labels["container"] == "app" && s.labels["seat"] == ctrs["app"].Env["KYB_GPU_SEAT"] {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("the pod's GPU use is not on its seat: %v", scrape(t, nodeA.MetricsURL, "kyb_container_gpu_memory_used_bytes", "kyb_gpu_memory_used_bytes", "kyb_gpu_unattributed_memory_used_bytes"))
	}

	// The same credentials, aimed at node-b: refused.
	pluginCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	asPlugin, err := kubernetes.NewForConfig(pluginCfg)
	if err != nil {
		t.Fatal(err)
	}
	foreign := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "not-mine"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: driver.Name, NodeName: ptr.To("node-b"), Pool: resourceapi.ResourcePool{Name: "node-b", ResourceSliceCount: 1},
	}}
	_, err = asPlugin.ResourceV1().ResourceSlices().Create(c.Ctx, foreign, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "denied") {
		t.Errorf("node-a's plugin wrote a ResourceSlice of node-b: %v", err)
	} else {
		t.Logf("refused as expected: %v", err)
	}
	slicesB, err := c.Client.ResourceV1().ResourceSlices().List(c.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-b"})
	if err != nil || len(slicesB.Items) == 0 {
		t.Fatalf("node-b slices: %v", err)
	}
	if err := asPlugin.ResourceV1().ResourceSlices().Delete(c.Ctx, slicesB.Items[0].Name, metav1.DeleteOptions{}); err == nil {
		t.Error("node-a's plugin deleted a ResourceSlice of node-b")
	}
	// On its own node too, only driver gpu.kyb.ai and the node's own pool.
	for _, s := range []struct{ driver, pool, want string }{
		{"gpu.nvidia.com", "node-a", `not of driver "gpu.nvidia.com"`},
		{driver.Name, "spare-pool", `not of pool "spare-pool"`},
	} {
		other := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: "not-mine-"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: s.driver, NodeName: ptr.To("node-a"), Pool: resourceapi.ResourcePool{Name: s.pool, ResourceSliceCount: 1},
		}}
		if _, err := asPlugin.ResourceV1().ResourceSlices().Create(c.Ctx, other, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), s.want) {
			t.Errorf("node-a's plugin created a slice of driver %s, pool %s on its node: %v", s.driver, s.pool, err)
		}
	}
	theirs, err := c.Client.ResourceV1().ResourceSlices().Create(c.Ctx, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-on-node-a"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: "gpu.nvidia.com", NodeName: ptr.To("node-a"), Pool: resourceapi.ResourcePool{Name: "node-a", ResourceSliceCount: 1},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := asPlugin.ResourceV1().ResourceSlices().Delete(c.Ctx, theirs.Name, metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), `not of driver "gpu.nvidia.com"`) {
		t.Errorf("node-a's plugin deleted another driver's slice on its node: %v", err)
	}
	createPod(t, c, podSpec{name: "on-b", node: "node-b", claims: fromTemplate("one-1x")})
	pb, _, _ := c.WaitForPodRunning(t, "default", "on-b", timeout)
	claimB := harness.PodClaim(pb, "gpu")
	device := resourceapply.AllocatedDeviceStatus().WithDriver(driver.Name).WithPool("node-b").WithDevice("g0-1x").
		WithData(runtime.RawExtension{Raw: []byte(`{"group":"stolen"}`)})
	if share := shareOf(t, c, claimB); share != "" {
		device = device.WithShareID(share)
	}
	apply := resourceapply.ResourceClaim(claimB, "default").WithStatus(resourceapply.ResourceClaimStatus().WithDevices(device))
	if _, err := asPlugin.ResourceV1().ResourceClaims("default").ApplyStatus(c.Ctx, apply, metav1.ApplyOptions{FieldManager: "intruder", Force: true}); err == nil {
		t.Error("node-a's plugin wrote the status of a claim allocated on node-b")
	} else {
		t.Logf("refused as expected: %v", err)
	}

	// Events: about its own Node and claims only.
	for _, ev := range []struct {
		name string
		ev   *eventsv1.Event
		want string
	}{
		{"about node-b", pluginEvent("default", corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: "node-b"}, nil),
			`may record events only about its own Node, not about node "node-b"`},
		{"about node-b's claim, as node-b", pluginEvent("default", corev1.ObjectReference{Kind: "ResourceClaim", APIVersion: "resource.k8s.io/v1", Namespace: "default", Name: claimB},
			&corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: "node-b"}), `only as their node, not as node "node-b"`},
		{"about a pod", pluginEvent("default", corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "default", Name: "on-b"}, nil),
			`not about a "Pod"`},
	} {
		if _, err := asPlugin.EventsV1().Events(ev.ev.Namespace).Create(c.Ctx, ev.ev, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), ev.want) {
			t.Errorf("node-a's plugin recorded an event %s: %v", ev.name, err)
		} else {
			t.Logf("refused as expected: %v", err)
		}
	}
	// No pods: not even its own node's.
	if _, err := asPlugin.CoreV1().Pods("").List(c.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"}); !apierrors.IsForbidden(err) {
		t.Errorf("node-a's plugin listed pods: %v", err)
	}

	// The audit log: what the plugin called, and that the chart allows
	// exactly those calls.
	user := "system:serviceaccount:kyb-system:" + sa
	// The claim's Prepared event is sent in the background.
	_ = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return slices.Contains(auditCalls(t, auditLog, user), "create events.k8s.io/events allowed"), nil
	})
	calls := auditCalls(t, auditLog, user)
	t.Logf("calls made with the chart's ServiceAccount: %s", strings.Join(calls, ", "))
	// Also granted, but not exercised here: list (clients without streaming
	// lists), update and delete of slices (republishing after a change),
	// and patch of events (a repeated event).
	for _, want := range []string{
		"watch resource.k8s.io/resourceslices", "create resource.k8s.io/resourceslices",
		"get resource.k8s.io/resourceclaims", "patch resource.k8s.io/resourceclaims/status", "get /nodes",
		"create events.k8s.io/events",
	} {
		if !slices.Contains(calls, want+" allowed") {
			t.Errorf("the plugin never made an allowed %q; is the rule still needed?", want)
		}
	}
	for _, call := range calls {
		refusedHere := strings.Contains(call, "resourceslices") || strings.Contains(call, "resourceclaims/status") || strings.Contains(call, "events") || call == "list /pods forbidden"
		if strings.HasSuffix(call, " forbidden") && !refusedHere {
			t.Errorf("the plugin was forbidden a call: %s", call)
		}
		if strings.Contains(call, " /pods ") && call != "list /pods forbidden" {
			t.Errorf("the plugin read pods: %s", call)
		}
	}
}

func shareOf(t *testing.T, c *harness.Cluster, claim string) string {
	t.Helper()
	cl, err := c.Client.ResourceV1().ResourceClaims("default").Get(c.Ctx, claim, metav1.GetOptions{})
	if err != nil || cl.Status.Allocation == nil {
		t.Fatalf("claim %s: %v", claim, err)
	}
	// A one-seat group is an ordinary device: no share.
	if id := cl.Status.Allocation.Devices.Results[0].ShareID; id != nil {
		return string(*id)
	}
	return ""
}

// auditCalls returns the distinct "verb group/resource[/sub] allowed|forbidden" of a user.
func auditCalls(t *testing.T, file, user string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e auditEntry
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.User.Username != user || e.ObjectRef == nil {
			continue
		}
		r := e.ObjectRef.APIGroup + "/" + e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			r += "/" + e.ObjectRef.Subresource
		}
		outcome := "allowed"
		if e.ResponseStatus != nil && (e.ResponseStatus.Code == 403 || e.ResponseStatus.Code == 422) {
			outcome = "forbidden"
		}
		seen[e.Verb+" "+r+" "+outcome] = true
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// pluginEvent is an event as the plugin's recorder writes one.
func pluginEvent(namespace string, regarding corev1.ObjectReference, related *corev1.ObjectReference) *eventsv1.Event {
	now := metav1.NewMicroTime(time.Now())
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("%s.%x", regarding.Name, now.UnixNano())},
		EventTime:  now, ReportingController: driver.Name, ReportingInstance: driver.Name + "-kyb-plugin-node-a",
		Action: "Prepared", Reason: "Prepared", Type: corev1.EventTypeNormal, Note: "seat 0 of G0",
		Regarding: regarding, Related: related,
	}
}
