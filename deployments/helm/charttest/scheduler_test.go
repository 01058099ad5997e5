//go:build charttest

package charttest

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The scheduler's objects carry this component label; nothing else does.
const schedulerComponent = "scheduler"

func component(o object) string {
	labels, _ := o.Contents["metadata"].(map[string]any)["labels"].(map[string]any)
	c, _ := labels["app.kubernetes.io/component"].(string)
	return c
}

// schedulerCase is a set of values with scheduler.enabled and what the
// chart must then render for kyb-scheduler.
type schedulerCase struct {
	name  string
	files []string
	set   []string

	image      string
	pullPolicy corev1.PullPolicy
	replicas   int32
	lease      string   // the lease's (and profile's) name
	extraArgs  []string // after the chart's own flags
	placement  bool     // nodeSelector, tolerations and affinity from values
	noRBAC     bool
	defrag     []string // the defragmentation flags, before extraArgs
	evicts     bool     // the ClusterRole grants pods/eviction
	readsJobs  bool     // the ClusterRole grants reading Jobs
}

// kyb-scheduler's Deployment, configuration and RBAC (values scheduler):
// the chart's image, leader election on a lease of the release's
// namespace, a pod that runs as non-root on a read-only root file system
// without capabilities on a control-plane node unless values say
// otherwise, HTTPS probes on its secure port, and a ServiceAccount of its
// own bound to a ClusterRole of the chart's (not the built-in
// system:kube-scheduler, which grants the default scheduler's lease), to
// a Role for its own lease only, and to the authentication reader in
// kube-system. Off by default. What the configuration loads as, and that
// the RBAC is enough and within kube-scheduler's own, test/e2e proves
// with the real binary (TestChartSchedulerConfigIsKybSchedulers,
// TestChartSchedulerRunsWithTheChartsRBAC).
func TestSchedulerValues(t *testing.T) {
	helmBinary(t)
	for _, o := range render(t, nil).objects {
		if component(o) == schedulerComponent {
			t.Errorf("the default values render the scheduler's %s %s; scheduler.enabled is false by default", o.Kind, o.Name)
		}
	}
	placement := filepath.Join(t.TempDir(), "placement.yaml")
	// Another trusted pool in place of the control plane: the default's
	// key cleared (null), the default tolerations replaced.
	if err := os.WriteFile(placement, []byte(`scheduler:
  nodeSelector: {node-role.kubernetes.io/control-plane: null, kyb.ai/pool: trusted}
  tolerations: [{key: kyb.ai/dedicated, operator: Equal, value: scheduler, effect: NoSchedule}]
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 1
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/component: scheduler}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []schedulerCase{
		{
			name:  "enabled",
			image: "ghcr.io/kyb-ai/kyb-dra-driver:0.1.0", pullPolicy: corev1.PullIfNotPresent, replicas: 1, lease: "kyb-scheduler",
		},
		{
			name:  "replicas, image, name, placement, flags",
			files: []string{placement},
			set: []string{"scheduler.replicas=2", "image.tag=1.2.3", "image.pullPolicy=Always", "scheduler.name=gpu-scheduler",
				"scheduler.extraArgs={--feature-gates=GenericWorkload=false}"},
			image: "ghcr.io/kyb-ai/kyb-dra-driver:1.2.3", pullPolicy: corev1.PullAlways, replicas: 2, lease: "gpu-scheduler",
			extraArgs: []string{"--feature-gates=GenericWorkload=false"}, placement: true,
		},
		{
			name:  "defragmentation",
			set:   []string{"scheduler.defragmentation.mode=on", "scheduler.defragmentation.period=10m", "scheduler.defragmentation.evictionsPerCycle=3"},
			image: "ghcr.io/kyb-ai/kyb-dra-driver:0.1.0", pullPolicy: corev1.PullIfNotPresent, replicas: 1, lease: "kyb-scheduler",
			defrag: []string{"--defragmentation=on", "--defragmentation-period=10m", "--defragmentation-evictions-per-cycle=3"}, evicts: true, readsJobs: true,
		},
		{
			name:  "defragmentation dry run",
			set:   []string{"scheduler.defragmentation.mode=dry-run"},
			image: "ghcr.io/kyb-ai/kyb-dra-driver:0.1.0", pullPolicy: corev1.PullIfNotPresent, replicas: 1, lease: "kyb-scheduler",
			defrag:    []string{"--defragmentation=dry-run", "--defragmentation-period=0s", "--defragmentation-evictions-per-cycle=2"},
			readsJobs: true,
		},
		{
			name:  "without RBAC",
			set:   []string{"rbac.create=false"},
			image: "ghcr.io/kyb-ai/kyb-dra-driver:0.1.0", pullPolicy: corev1.PullIfNotPresent, replicas: 1, lease: "kyb-scheduler",
			noRBAC: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := append([]string{"scheduler.enabled=true"}, tc.set...)
			lintArgs := append([]string{"lint", "--strict", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, valueArgs(tc.files, set)...)
			if out, stderr, err := runHelm(t, lintArgs...); err != nil {
				t.Fatalf("helm lint: %v\n%s%s", err, out, stderr)
			}
			m := render(t, tc.files, set...)
			dep := checkSchedulerDeployment(t, m, tc)
			checkSchedulerRBAC(t, m, tc, dep.Spec.Template.Spec.ServiceAccountName)
		})
	}
}

func checkSchedulerDeployment(t *testing.T, m *manifest, tc schedulerCase) *appsv1.Deployment {
	t.Helper()
	var dep appsv1.Deployment
	decode(t, m.one(t, "Deployment"), &dep)
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != tc.replicas {
		t.Errorf("replicas %v, want %d", dep.Spec.Replicas, tc.replicas)
	}
	plugin := daemonSet(t, m).Spec.Template.Spec.Containers[0]
	if c.Image != tc.image || c.Image != plugin.Image || c.ImagePullPolicy != tc.pullPolicy || c.ImagePullPolicy != plugin.ImagePullPolicy {
		t.Errorf("image %s (%s), want %s (%s), the plugin's", c.Image, c.ImagePullPolicy, tc.image, tc.pullPolicy)
	}
	if !slices.Equal(c.Command, []string{"/usr/local/bin/kyb-scheduler"}) {
		t.Errorf("command %v", c.Command)
	}
	want := append([]string{
		"--config=/etc/kyb-scheduler/config.yaml",
		"--leader-elect=true", "--leader-elect-resource-namespace=" + namespace, "--leader-elect-resource-name=" + tc.lease,
		"--secure-port=10259", "--v=2",
	}, append(slices.Clone(tc.defrag), tc.extraArgs...)...)
	if !slices.Equal(c.Args, want) {
		t.Errorf("args\n got %q\nwant %q", c.Args, want)
	}

	// The configuration: a ConfigMap's config.yaml at --config.
	var cm corev1.ConfigMap
	decode(t, mountedConfigMap(t, m, pod.Volumes), &cm)
	if !strings.Contains(cm.Data["config.yaml"], "schedulerName: "+`"`+tc.lease+`"`) {
		t.Errorf("the configuration names no profile %q:\n%s", tc.lease, cm.Data["config.yaml"])
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/etc/kyb-scheduler" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("volume mounts %+v, want the configuration at /etc/kyb-scheduler, read only", c.VolumeMounts)
	}
	if dep.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config: a changed configuration would not roll the pods")
	}

	// Security: non-root, read-only, no capabilities, no host access.
	psc, sc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v, want non-root and RuntimeDefault seccomp", psc)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %+v, want a read-only root, no privilege escalation, every capability dropped", sc)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("the scheduler uses a host namespace")
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("host path volume %s", v.Name)
		}
	}
	if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Error("the scheduler's pod mounts no ServiceAccount token; it calls the API")
	}

	// Probes: kube-scheduler's secure port, which serves /healthz and
	// /readyz to anyone.
	if len(c.Ports) != 1 || c.Ports[0].Name != "https" || c.Ports[0].ContainerPort != 10259 {
		t.Errorf("ports %+v, want https on 10259", c.Ports)
	}
	for path, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Port != intstr.FromString("https") {
			t.Errorf("probe of %s: %+v, want an HTTPS GET on port https", path, p)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("resources %+v, want requests", c.Resources)
	}

	// Its token binds, allocates and deletes anything: by default its pod
	// runs where the control plane does, never on a GPU node.
	if tc.placement {
		want := []corev1.Toleration{{Key: "kyb.ai/dedicated", Operator: corev1.TolerationOpEqual, Value: "scheduler", Effect: corev1.TaintEffectNoSchedule}}
		if !reflect.DeepEqual(pod.NodeSelector, map[string]string{"kyb.ai/pool": "trusted"}) || !reflect.DeepEqual(pod.Tolerations, want) ||
			pod.Affinity == nil || pod.Affinity.PodAntiAffinity == nil {
			t.Errorf("nodeSelector %v, tolerations %v, affinity %+v: not the values'", pod.NodeSelector, pod.Tolerations, pod.Affinity)
		}
	} else {
		want := []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
		if !reflect.DeepEqual(pod.NodeSelector, map[string]string{"node-role.kubernetes.io/control-plane": ""}) || !reflect.DeepEqual(pod.Tolerations, want) || pod.Affinity != nil {
			t.Errorf("nodeSelector %v, tolerations %v, affinity %+v by default; want control-plane nodes only (their label and taint), and none of the plugin's (GPU nodes)", pod.NodeSelector, pod.Tolerations, pod.Affinity)
		}
	}
	return &dep
}

// mountedConfigMap returns the ConfigMap that volumes mount (the chart
// renders the node configuration's too).
func mountedConfigMap(t *testing.T, m *manifest, volumes []corev1.Volume) object {
	t.Helper()
	for _, v := range volumes {
		if v.ConfigMap == nil {
			continue
		}
		for _, cm := range m.ofKind("ConfigMap") {
			if cm.Name == v.ConfigMap.Name {
				return cm
			}
		}
		t.Fatalf("the Deployment mounts ConfigMap %s, which the chart does not render", v.ConfigMap.Name)
	}
	t.Fatal("the Deployment mounts no ConfigMap")
	return object{}
}

func checkSchedulerRBAC(t *testing.T, m *manifest, tc schedulerCase, sa string) {
	t.Helper()
	pluginSA := "kyb-kyb-dra-driver"
	if sa == "" || sa == pluginSA {
		t.Errorf("the scheduler runs as ServiceAccount %q; it needs one of its own, not the plugin's (confined to its node)", sa)
	}
	var saFound bool
	for _, o := range m.ofKind("ServiceAccount") {
		saFound = saFound || o.Name == sa
	}
	if !saFound {
		t.Errorf("no ServiceAccount %s rendered", sa)
	}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: namespace}}
	// What is bound to the scheduler's ServiceAccount, by role.
	bound := map[string]string{}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range m.ofKind(kind) {
			var b rbacv1.RoleBinding // the same fields as a ClusterRoleBinding
			decode(t, o, &b)
			if !reflect.DeepEqual(b.Subjects, subject) {
				continue
			}
			bound[b.RoleRef.Kind+" "+b.RoleRef.Name] = b.Namespace
		}
	}
	if tc.noRBAC {
		if len(bound) > 0 {
			t.Errorf("rbac.create=false, but the chart binds %v", bound)
		}
		return
	}
	// No built-in scheduler role: system:kube-scheduler also grants
	// get/update of the lease kube-scheduler in every namespace, the
	// default scheduler's.
	want := map[string]string{
		"ClusterRole kyb-kyb-dra-driver-kyb-system-scheduler": "",
		"Role kyb-kyb-dra-driver-scheduler-lease":             namespace,
		"Role extension-apiserver-authentication-reader":      "kube-system",
	}
	if !reflect.DeepEqual(bound, want) {
		t.Errorf("bound to the scheduler's ServiceAccount (role: namespace):\n got %v\nwant %v", bound, want)
	}
	var cr *rbacv1.ClusterRole
	for _, o := range m.ofKind("ClusterRole") {
		if component(o) == schedulerComponent {
			cr = &rbacv1.ClusterRole{}
			decode(t, o, cr)
		}
	}
	if cr == nil || cr.Name != "kyb-kyb-dra-driver-kyb-system-scheduler" {
		t.Fatalf("the scheduler's ClusterRole: %+v", cr)
	}
	wantRules := slices.Clone(wantSchedulerClusterRules)
	if tc.evicts {
		// After pods/binding.
		wantRules = slices.Insert(wantRules, 3, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}})
	}
	if tc.readsJobs {
		// After apps.
		apps := slices.IndexFunc(wantRules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.APIGroups, "apps") })
		wantRules = slices.Insert(wantRules, apps+1, rbacv1.PolicyRule{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "list", "watch"}})
	}
	if !reflect.DeepEqual(cr.Rules, wantRules) {
		t.Errorf("the scheduler's ClusterRole rules:\n got %+v\nwant %+v", cr.Rules, wantRules)
	}
	for _, r := range cr.Rules {
		if slices.Contains(r.APIGroups, "coordination.k8s.io") || slices.Contains(r.Verbs, "*") || slices.Contains(r.Resources, "*") {
			t.Errorf("the scheduler's ClusterRole grants %+v in every namespace", r)
		}
	}
	// Leases: its own, by name, in the release's namespace only; create
	// cannot be limited to a name (the name is not known before the
	// object exists).
	var role rbacv1.Role
	decode(t, m.one(t, "Role"), &role)
	wantRules = []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{tc.lease}, Verbs: []string{"get", "update"}},
	}
	if role.Namespace != namespace || !reflect.DeepEqual(role.Rules, wantRules) {
		t.Errorf("Role %s/%s rules\n got %+v\nwant %+v", role.Namespace, role.Name, role.Rules, wantRules)
	}
}

// What kube-scheduler 1.37 calls with kyb-scheduler's feature gates (its
// defaults and GenericWorkload): system:kube-scheduler and
// system:volume-scheduler of Kubernetes 1.37 without their leases and
// lease candidates (coordinated leader election is off), the legacy
// bindings resource and extensions group, pods/finalizers (the scheduler
// sets no blockOwnerDeletion) and composite pod groups (an alpha gate that
// is off). README "kyb-scheduler" says why each rule is there; test/e2e
// (TestChartSchedulerRunsWithTheChartsRBAC) that it is enough and within
// the API server's own roles.
var wantSchedulerClusterRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
	{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"nodes", "namespaces", "services", "replicationcontrollers"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"apps"}, Resources: []string{"replicasets", "statefulsets"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"persistentvolumes", "persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
	{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses", "csinodes", "csidrivers", "csistoragecapacities", "volumeattachments"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
	{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"deviceclasses", "resourceslices", "devicetaintrules"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status", "resourceclaims/binding"}, Verbs: []string{"update", "patch"}},
	{APIGroups: []string{"scheduling.k8s.io"}, Resources: []string{"podgroups"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"scheduling.k8s.io"}, Resources: []string{"podgroups/status"}, Verbs: []string{"patch", "update"}},
}

// Bad scheduler values are refused with a message naming the value.
func TestSchedulerValuesRefused(t *testing.T) {
	helmBinary(t)
	for _, tc := range []struct {
		name string
		set  []string
		want string
	}{
		{"an unknown policy", []string{"scheduler.policy=binpack"},
			"at '/scheduler/policy': value must be one of 'pack', 'topology', 'spread'"},
		{"an unknown policy of a class", []string{"scheduler.deviceClassPolicies.gpu-4x-seat\\.kyb\\.ai=packed"},
			"at '/scheduler/deviceClassPolicies/gpu-4x-seat.kyb.ai': value must be one of 'pack', 'topology', 'spread'"},
		{"a weight of 0", []string{"scheduler.weight=0"},
			"at '/scheduler/weight': minimum: got 0, want 1"},
		{"a misspelt key", []string{"scheduler.replica=2"},
			"at '/scheduler': additional properties 'replica' not allowed"},
		{"with the device-plugin shim", []string{"mode=device-plugin"},
			"scheduler.enabled needs mode=dra"},
		{"a whole configuration beside a policy", []string{"scheduler.config.apiVersion=kubescheduler.config.k8s.io/v1", "scheduler.config.kind=KubeSchedulerConfiguration", "scheduler.policy=topology"},
			"scheduler.config replaces the configuration that scheduler.policy"},
		{"a whole configuration beside a class's policy", []string{"scheduler.config.kind=KubeSchedulerConfiguration", "scheduler.deviceClassPolicies.gpu-4x-seat\\.kyb\\.ai=topology"},
			"scheduler.config replaces the configuration that scheduler.policy"},
		{"a whole configuration without the scheduler's name", []string{"scheduler.config.kind=KubeSchedulerConfiguration", "scheduler.config.profiles[0].schedulerName=other-name"},
			`scheduler.name "kyb-scheduler" names no profile of scheduler.config (profiles: other-name)`},
		{"a flag the chart sets", []string{"scheduler.extraArgs[0]=--secure-port=10300"},
			`scheduler.extraArgs: "--secure-port=10300" sets a flag the chart sets itself`},
		{"an unknown defragmentation mode", []string{"scheduler.defragmentation.mode=aggressive"},
			"at '/scheduler/defragmentation/mode': value must be one of 'off', 'on', 'dry-run'"},
		{"a defragmentation period that is no duration", []string{"scheduler.defragmentation.period=10"},
			"at '/scheduler/defragmentation/period'"},
		{"defragmentation by extraArgs", []string{"scheduler.extraArgs[0]=--defragmentation=on"},
			`scheduler.extraArgs: "--defragmentation=on": use scheduler.defragmentation`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := renderError(t, namespace, []string{"--kube-version", kubeVersion}, append([]string{"scheduler.enabled=true"}, tc.set...)...)
			if !strings.Contains(msg, tc.want) {
				t.Errorf("helm's message lacks %q:\n%s", tc.want, msg)
			}
		})
	}
}

// The lease Role grants its one name in the release's namespace: in
// kube-system, the name kube-scheduler would grant the default
// scheduler's lease, and kyb-scheduler would contend for it.
func TestSchedulerLeaseIsNeverTheDefaultSchedulers(t *testing.T) {
	helmBinary(t)
	msg := renderError(t, "kube-system", []string{"--kube-version", kubeVersion}, "scheduler.enabled=true", "scheduler.name=kube-scheduler")
	if want := `scheduler.name "kube-scheduler" in namespace kube-system names the default scheduler's leader election lease`; !strings.Contains(msg, want) {
		t.Errorf("helm's message lacks %q:\n%s", want, msg)
	}
	// Elsewhere the name is a lease like any other.
	out, stderr, err := runHelm(t, "template", releaseName, chartDir, "--namespace", namespace, "--kube-version", kubeVersion,
		"--set", "scheduler.enabled=true", "--set", "scheduler.name=kube-scheduler")
	if err != nil {
		t.Fatalf("scheduler.name=kube-scheduler in %s: %v\n%s", namespace, err, stderr)
	}
	if !strings.Contains(out, "--leader-elect-resource-namespace="+namespace) {
		t.Errorf("the lease is not in the release's namespace:\n%s", out)
	}
}

// With the scheduler on, NOTES say how to see it run, how pods use it (all
// under one scheduler: by the chart's policies, or by hand where they are
// off), and where it runs.
func TestSchedulerNotes(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		want []string
	}{
		{"policies on", nil, []string{"It schedules every pod with resourceClaims or an extended resource of the GPUs",
			"set spec.schedulerName: kyb-scheduler on those that name no", "refuse those that name another (scheduler.gpuPods)"}},
		{"policies off", []string{"--set", "scheduler.gpuPods.assign=false"}, []string{"spec.schedulerName: kyb-scheduler",
			"Give every pod that claims these GPUs to one scheduler"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"install", releaseName, chartDir, "--namespace", namespace, "--dry-run=client", "--set", "scheduler.enabled=true"}, tc.set...)
			out, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm install --dry-run=client: %v\n%s", err, stderr)
			}
			_, notes, _ := strings.Cut(out, "NOTES:\n")
			for _, w := range append([]string{"rollout status deployment/kyb-kyb-dra-driver-scheduler", "get lease kyb-scheduler",
				"Its pod runs on a control-plane node"}, tc.want...) {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES lack %q:\n%s", w, notes)
				}
			}
		})
	}
}
