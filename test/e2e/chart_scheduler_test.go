package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// The chart's kyb-scheduler (values scheduler) is tested here, with the real
// binary: its configuration as kyb-scheduler loads it (strictly: an unknown
// field is an error), and the Deployment's flags, configuration and RBAC
// against a real API server that authorizes with RBAC.

// kybSchedulerBinary is the kyb-scheduler that make e2e builds.
func kybSchedulerBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("KYB_SCHEDULER")
	if bin == "" {
		t.Fatal("KYB_SCHEDULER is not set: run the end-to-end tests through `make e2e`, which builds bin/kyb-scheduler and passes its path")
	}
	return bin
}

// chartObjects decodes a rendered chart.
func chartObjects(t *testing.T, rendered []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	var out []*unstructured.Unstructured
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("decode the rendered chart: %v", err)
		}
		if len(raw) > 0 {
			out = append(out, &unstructured.Unstructured{Object: raw})
		}
	}
}

// schedulerObjects returns the rendered kyb-scheduler Deployment and its
// configuration file.
func schedulerObjects(t *testing.T, objs []*unstructured.Unstructured) (*appsv1.Deployment, string) {
	t.Helper()
	var dep *appsv1.Deployment
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			dep = &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, dep, true); err != nil {
				t.Fatalf("Deployment %s: %v", o.GetName(), err)
			}
		}
	}
	if dep == nil {
		t.Fatal("the chart renders no Deployment with scheduler.enabled")
	}
	var cmName string
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == cmName {
			cfg, _, _ := unstructured.NestedString(o.Object, "data", "config.yaml")
			if cfg == "" {
				t.Fatalf("ConfigMap %s has no config.yaml", cmName)
			}
			return dep, cfg
		}
	}
	t.Fatalf("the Deployment mounts ConfigMap %q, which the chart does not render", cmName)
	return nil, ""
}

// writeConfig runs kyb-scheduler --write-config-to: the configuration in
// effect, as kyb-scheduler loads, defaults and validates it (its profiles'
// plugins built), written out. config "" is its built-in configuration.
func writeConfig(t *testing.T, bin, config string) (map[string]any, error) {
	t.Helper()
	dir := t.TempDir()
	// The scheduler builds its client, but contacts nobody, before it
	// writes the file and exits.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "written.yaml")
	args := []string{"--write-config-to=" + out, "--kubeconfig=" + kubeconfig}
	if config != "" {
		file := filepath.Join(dir, "config.yaml")
		// --kubeconfig is ignored where --config is given.
		if err := os.WriteFile(file, []byte(config+"\nclientConnection:\n  kubeconfig: "+kubeconfig+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config="+file)
	}
	if output, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		// Its last line says why.
		lines := strings.Split(strings.TrimSpace(string(output)), "\n")
		return nil, fmt.Errorf("%w: %s", err, lines[len(lines)-1])
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := sigsyaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg, nil
}

// profiles returns a written configuration's profiles by scheduler name.
func profiles(cfg map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	list, _ := cfg["profiles"].([]any)
	for _, p := range list {
		m, _ := p.(map[string]any)
		name, _ := m["schedulerName"].(string)
		out[name] = m
	}
	return out
}

// multiPointWeight is a plugin's weight among a profile's multiPoint
// plugins; 0 where it is not there.
func multiPointWeight(profile map[string]any, plugin string) float64 {
	enabled, _, _ := unstructured.NestedSlice(profile, "plugins", "multiPoint", "enabled")
	for _, e := range enabled {
		m, _ := e.(map[string]any)
		if m["name"] == plugin {
			w, _ := m["weight"].(float64)
			return w
		}
	}
	return 0
}

// pluginArgs is a plugin's args in a profile, as JSON.
func pluginArgs(t *testing.T, profile map[string]any, plugin string) string {
	t.Helper()
	list, _ := profile["pluginConfig"].([]any)
	for _, pc := range list {
		m, _ := pc.(map[string]any)
		if m["name"] == plugin {
			data, err := json.Marshal(m["args"])
			if err != nil {
				t.Fatal(err)
			}
			return string(data)
		}
	}
	return ""
}

// The chart's KubeSchedulerConfiguration is what kyb-scheduler loads: with
// the default values, the very profile of its built-in configuration;
// with values, their name, policies and weight; values scheduler.config as
// written. kyb-scheduler decodes strictly, so a field the chart misspelt
// would fail here.
func TestChartSchedulerConfigIsKybSchedulers(t *testing.T) {
	bin := kybSchedulerBinary(t)
	builtin, err := writeConfig(t, bin, "")
	if err != nil {
		t.Fatalf("kyb-scheduler's built-in configuration: %v", err)
	}
	dir := t.TempDir()
	hatch := filepath.Join(dir, "hatch.yaml")
	if err := os.WriteFile(hatch, []byte(`scheduler:
  enabled: true
  name: gpu-scheduler
  config:
    apiVersion: kubescheduler.config.k8s.io/v1
    kind: KubeSchedulerConfiguration
    profiles:
    - schedulerName: gpu-scheduler
      plugins:
        multiPoint:
          enabled: [{name: KybPlacement, weight: 2}]
      pluginConfig:
      - name: KybPlacement
        args: {defaultPolicy: spread}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	misspelt := filepath.Join(dir, "misspelt.yaml")
	if err := os.WriteFile(misspelt, []byte(`scheduler:
  enabled: true
  name: gpu-scheduler
  config:
    apiVersion: kubescheduler.config.k8s.io/v1
    kind: KubeSchedulerConfiguration
    profiles:
    - schedulerName: gpu-scheduler
      plugins:
        multiPoint:
          enabled: [{name: KybPlacement}]
      pluginConfig:
      - name: KybPlacement
        args: {defaultPolicey: spread}
`), 0o644); err != nil {
		t.Fatal(err)
	}

	const mostAllocated = `{"apiVersion":"kubescheduler.config.k8s.io/v1","kind":"NodeResourcesFitArgs","scoringStrategy":{"resources":[{"name":"cpu","weight":1},{"name":"memory","weight":1}],"type":"MostAllocated"}}`
	const leastAllocated = `{"apiVersion":"kubescheduler.config.k8s.io/v1","kind":"NodeResourcesFitArgs","scoringStrategy":{"resources":[{"name":"cpu","weight":1},{"name":"memory","weight":1}],"type":"LeastAllocated"}}`
	for _, tc := range []struct {
		name        string
		args        []string
		profile     string
		weight      float64
		placement   string // KybPlacement's args
		fit         string // NodeResourcesFit's args
		sameBuiltin bool   // the built-in configuration's profiles
		refused     string // kyb-scheduler refuses the configuration, saying this
	}{
		{
			name:    "default values",
			profile: "kyb-scheduler", weight: 5, placement: `{"defaultPolicy":"pack"}`, fit: mostAllocated,
			sameBuiltin: true,
		},
		{
			name: "name, policy, class policies and weight",
			args: []string{"--set", "scheduler.name=gpu-scheduler", "--set", "scheduler.policy=topology", "--set", "scheduler.weight=3",
				"--set-json", `scheduler.deviceClassPolicies={"gpu-4x-seat.kyb.ai":"spread","gpu-1x-seat.kyb.ai":"pack"}`},
			profile: "gpu-scheduler", weight: 3, fit: mostAllocated,
			placement: `{"defaultPolicy":"topology","deviceClassPolicies":{"gpu-1x-seat.kyb.ai":"pack","gpu-4x-seat.kyb.ai":"spread"}}`,
		},
		{
			name:    "a whole configuration, as written",
			args:    []string{"-f", hatch},
			profile: "gpu-scheduler", weight: 2, placement: `{"defaultPolicy":"spread"}`, fit: leastAllocated,
		},
		{
			name:    "a whole configuration with a misspelt field",
			args:    []string{"-f", misspelt},
			refused: `json: unknown field \"defaultPolicey\"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--set", "scheduler.enabled=true"}, tc.args...)
			_, config := schedulerObjects(t, chartObjects(t, helmTemplate(t, "kyb", "kyb-system", args...)))
			cfg, err := writeConfig(t, bin, config)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("kyb-scheduler loaded the configuration, or refused it for another reason (%v); want %s", err, tc.refused)
				}
				t.Logf("refused as expected: %s", strings.TrimSpace(err.Error()))
				return
			}
			if err != nil {
				t.Fatalf("kyb-scheduler refuses the chart's configuration:\n%s\n%v", config, err)
			}
			got := profiles(cfg)
			if len(got) != 1 || got[tc.profile] == nil {
				t.Fatalf("profiles %v, want only %s", slices.Sorted(maps.Keys(got)), tc.profile)
			}
			p := got[tc.profile]
			if w := multiPointWeight(p, "KybPlacement"); w != tc.weight {
				t.Errorf("KybPlacement's weight %v, want %v", w, tc.weight)
			}
			if a := pluginArgs(t, p, "KybPlacement"); a != tc.placement {
				t.Errorf("KybPlacement's args %s, want %s", a, tc.placement)
			}
			if a := pluginArgs(t, p, "NodeResourcesFit"); a != tc.fit {
				t.Errorf("NodeResourcesFit's args %s, want %s", a, tc.fit)
			}
			if tc.sameBuiltin && !reflect.DeepEqual(cfg["profiles"], builtin["profiles"]) {
				a, _ := sigsyaml.Marshal(cfg["profiles"])
				b, _ := sigsyaml.Marshal(builtin["profiles"])
				t.Errorf("the chart's profile differs from kyb-scheduler's built-in one:\n--- chart\n%s\n--- built-in\n%s", a, b)
			}
		})
	}
}

// The chart's kyb-scheduler, run as its Deployment runs it: the real
// binary with the Deployment's flags and the chart's configuration (policy
// spread here, so that the placement shows the chart's configuration is
// the one in effect), as the chart's ServiceAccount, on an API server that
// authorizes with RBAC. It schedules a pod with a claim (allocating the
// claim and binding the pod), leads on the lease of the release's
// namespace, and is refused nothing: neither in its log nor in the API
// server's audit log. The chart's ClusterRole grants nothing the API
// server's own roles of kube-scheduler do not, and the ServiceAccount
// cannot touch the default scheduler's lease.
func TestChartSchedulerRunsWithTheChartsRBAC(t *testing.T) {
	bin := kybSchedulerBinary(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	auditLog := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	c := harness.Start(t, harness.Options{
		// Gang scheduling, as docs/kyb-scheduler.md asks of the API server:
		// kyb-scheduler watches pod groups.
		FeatureGates: map[string]bool{"GenericWorkload": true},
		APIServerFlags: []string{"--authorization-mode=Node,RBAC", "--runtime-config=scheduling.k8s.io/v1beta1=true",
			"--audit-policy-file=" + policy, "--audit-log-path=" + auditLog, "--audit-log-mode=blocking", "--audit-log-format=json"},
		Nodes: []harness.NodeOptions{
			{Name: "node-a", Preset: "workstation-2gpu"},
			{Name: "node-b", Preset: "workstation-2gpu"},
		},
	})
	const ns = "kyb-system"
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rendered := helmTemplate(t, "kyb", ns, "--set", "scheduler.enabled=true", "--set", "scheduler.policy=spread")
	if _, err := c.Apply(rendered, harness.ApplyOptions{Namespace: ns}); err != nil {
		t.Fatalf("install the chart: %v", err)
	}
	dep, config := schedulerObjects(t, chartObjects(t, rendered))
	pod := dep.Spec.Template.Spec
	sa := pod.ServiceAccountName
	if sa == "" || len(pod.Containers) != 1 {
		t.Fatalf("the scheduler's pod: ServiceAccount %q, %d containers", sa, len(pod.Containers))
	}

	// Its pod meets the Pod Security "restricted" level: the API server's
	// PodSecurity admission, enforcing it, admits the Deployment's pod.
	restricted := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restricted", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, restricted, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	asPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kyb-scheduler", Namespace: restricted.Name}, Spec: pod}
	if _, err := c.Client.CoreV1().Pods(restricted.Name).Create(c.Ctx, asPod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the scheduler's pod in a namespace enforcing Pod Security \"restricted\": %v", err)
	}

	// Its credentials: a token of the chart's ServiceAccount, as the pod's
	// mounted token would be.
	tr, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(c.Ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for the scheduler's ServiceAccount: %v", err)
	}
	kubeconfig := filepath.Join(dir, "scheduler-kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, tr.Status.Token); err != nil {
		t.Fatal(err)
	}
	// The Deployment's flags, but --config: the harness writes the file.
	var args []string
	for _, a := range pod.Containers[0].Args {
		if !strings.HasPrefix(a, "--config=") && !strings.HasPrefix(a, "--secure-port=") {
			args = append(args, a)
		}
	}
	// In a pod, the scheduler finds the API server for its authentication
	// and authorization of clients (the client CAs in kube-system, token
	// and access reviews) in its in-cluster configuration; here it is told.
	args = append(args, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig)
	sched := c.StartKybScheduler(harness.KybSchedulerOptions{
		Binary: bin,
		Name:   "chart-scheduler",
		// In a pod, an empty kubeconfig is the in-cluster configuration.
		Config: config + "\nclientConnection:\n  kubeconfig: " + kubeconfig + "\n",
		Args:   args,
	})
	defer func() {
		if t.Failed() {
			t.Logf("kyb-scheduler's log, last lines:\n%s", sched.Tail(60))
		}
	}()

	checkSchedulerRoleWithinKubeSchedulers(t, c, chartObjects(t, rendered), ns, sa)

	// The leader's lease, in the release's namespace.
	var holder string
	err = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		lease, err := c.Client.CoordinationV1().Leases(ns).Get(ctx, kybScheduler, metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *lease.Spec.HolderIdentity
		return holder != "", nil
	})
	if err != nil {
		t.Fatalf("no leader on lease %s/%s: %v", ns, kybScheduler, err)
	}
	t.Logf("lease %s/%s held by %s", ns, kybScheduler, holder)
	if _, err := c.Client.CoordinationV1().Leases("kube-system").Get(c.Ctx, kybScheduler, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a lease kube-system/%s exists (%v): the flags did not move it", kybScheduler, err)
	}

	// Two 1x seats: spread puts them on two nodes (pack would put both on
	// one: each node has two).
	createTemplate(t, c, "one-1x", class1x)
	nodes := map[string]bool{}
	for _, name := range []string{"spread-0", "spread-1"} {
		kybPod(t, c, name, seatFrom("one-1x"))
		p, _, _ := c.WaitForPodRunning(t, "default", name, timeout)
		claim := waitClaimStatus(t, c, "default", harness.PodClaim(p, "gpu"))
		if claim.Status.Allocation == nil {
			t.Fatalf("pod %s runs without an allocated claim", name)
		}
		nodes[p.Spec.NodeName] = true
	}
	logPods(t, c, "two 1x seat pods, the chart's kyb-scheduler with scheduler.policy=spread")
	if len(nodes) != 2 {
		t.Errorf("the pods ran on %v, want two nodes (the chart's policy, spread)", slices.Sorted(maps.Keys(nodes)))
	}

	// The leader renews its lease (every 2 s) as the chart's Role allows.
	user := "system:serviceaccount:" + ns + ":" + sa
	_ = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return slices.Contains(auditCalls(t, auditLog, user), "update coordination.k8s.io/leases allowed"), nil
	})
	calls := auditCalls(t, auditLog, user)
	t.Logf("calls made with the chart's ServiceAccount: %s", strings.Join(calls, ", "))
	for _, want := range []string{
		// Its own Role: the lease.
		"create coordination.k8s.io/leases", "get coordination.k8s.io/leases", "update coordination.k8s.io/leases",
		// The authentication reader in kube-system.
		"get /configmaps", "watch /configmaps",
		// The chart's ClusterRole: what scheduling a pod with a claim takes.
		"watch resource.k8s.io/resourceslices", "watch resource.k8s.io/deviceclasses", "watch scheduling.k8s.io/podgroups",
		"update resource.k8s.io/resourceclaims/status", "create /pods/binding",
	} {
		if !slices.Contains(calls, want+" allowed") {
			t.Errorf("the scheduler never made an allowed %q", want)
		}
	}
	for _, call := range calls {
		if strings.HasSuffix(call, " forbidden") {
			t.Errorf("the scheduler was forbidden a call: %s", call)
		}
	}
	log, err := os.ReadFile(sched.Log)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") || strings.Contains(line, " 403") {
			t.Errorf("kyb-scheduler's log: %s", line)
		}
	}
}

// checkSchedulerRoleWithinKubeSchedulers checks the chart's scheduler
// ClusterRole against the API server's own roles of kube-scheduler (the
// user system:kube-scheduler holds system:kube-scheduler and
// system:volume-scheduler): every verb it grants, they grant. And the
// chart's ServiceAccount may renew its own lease but not the default
// scheduler's, kube-system/kube-scheduler, which system:kube-scheduler
// grants.
func checkSchedulerRoleWithinKubeSchedulers(t *testing.T, c *harness.Cluster, objs []*unstructured.Unstructured, ns, sa string) {
	t.Helper()
	var role *rbacv1.ClusterRole
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetLabels()["app.kubernetes.io/component"] == "scheduler" {
			role = &rbacv1.ClusterRole{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, role, true); err != nil {
				t.Fatalf("ClusterRole %s: %v", o.GetName(), err)
			}
		}
	}
	if role == nil {
		t.Fatal("the chart renders no ClusterRole of the scheduler")
	}
	allowed := func(user string, attrs *authorizationv1.ResourceAttributes) bool {
		t.Helper()
		sar, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(c.Ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:authenticated"}, ResourceAttributes: attrs,
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		return sar.Status.Allowed
	}
	checked := 0
	for _, r := range role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %+v: the scheduler's ClusterRole names resources or URLs; its lease is a Role's", r)
		}
		for _, group := range r.APIGroups {
			for _, res := range r.Resources {
				resource, sub, _ := strings.Cut(res, "/")
				for _, verb := range r.Verbs {
					checked++
					if !allowed("system:kube-scheduler", &authorizationv1.ResourceAttributes{Group: group, Resource: resource, Subresource: sub, Verb: verb}) {
						t.Errorf("the chart grants %s %s/%s, which the API server's roles of kube-scheduler do not", verb, group, res)
					}
				}
			}
		}
	}
	user := "system:serviceaccount:" + ns + ":" + sa
	for _, tc := range []struct {
		attrs authorizationv1.ResourceAttributes
		want  bool
	}{
		{authorizationv1.ResourceAttributes{Namespace: ns, Group: "coordination.k8s.io", Resource: "leases", Name: kybScheduler, Verb: "update"}, true},
		{authorizationv1.ResourceAttributes{Namespace: "kube-system", Group: "coordination.k8s.io", Resource: "leases", Name: "kube-scheduler", Verb: "get"}, false},
		{authorizationv1.ResourceAttributes{Namespace: "kube-system", Group: "coordination.k8s.io", Resource: "leases", Name: "kube-scheduler", Verb: "update"}, false},
		{authorizationv1.ResourceAttributes{Namespace: "kube-system", Group: "coordination.k8s.io", Resource: "leases", Verb: "create"}, false},
		{authorizationv1.ResourceAttributes{Namespace: ns, Group: "coordination.k8s.io", Resource: "leases", Name: "kube-scheduler", Verb: "update"}, false},
	} {
		if got := allowed(user, &tc.attrs); got != tc.want {
			t.Errorf("the chart's ServiceAccount may %s lease %s/%s: %v, want %v", tc.attrs.Verb, tc.attrs.Namespace, tc.attrs.Name, got, tc.want)
		}
	}
	t.Logf("the chart's scheduler ClusterRole: %d verbs, each granted by the API server's roles of kube-scheduler; the default scheduler's lease refused", checked)
}
