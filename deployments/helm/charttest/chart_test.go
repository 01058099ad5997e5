//go:build charttest

package charttest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	sigsyaml "sigs.k8s.io/yaml"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-dra-plugin/app"
)

// wantProfile is a profile as LoadNodeConfig must read it from the ConfigMap.
type wantProfile struct {
	resource      string
	name          string
	size          int
	seats         int
	overprovision bool
	sharing       string // strategy, and /interval where one is set, /sized for a sized profile
}

// chartCase is one set of values and what the rendered chart must then say.
type chartCase struct {
	name  string
	files []string
	set   []string

	deviceMode  bool // mode device-plugin
	extended    bool // DeviceClasses map extended resources
	privileged  bool
	mps         bool   // pods as MPS daemons need them
	mig         bool   // a MIG profile on real GPUs: the MIG config capability
	mpsControl  string // KYB_MPS_CONTROL; empty: unset
	mpsShm      string // KYB_MPS_SHM_SIZE_MIB; empty: the default, 256
	seamless    bool
	simulated   bool
	noPodGPU    bool              // metrics.podGPU.enabled=false
	monitoring  bool              // ServiceMonitor, PodMonitor and dashboard
	driverMount map[string]string // host path -> container path of the driver root
	kubeletRoot string            // kubeletRootDir; empty: /var/lib/kubelet
	profiles    []wantProfile     // nil: the driver's defaults
	groups      map[string][]int
}

var seedProfiles = []wantProfile{
	{resource: "kyb.ai/gpu-1x-seat", name: "1x", size: 1, seats: 4},
	{resource: "kyb.ai/gpu-2x-seat", name: "2x", size: 2, seats: 3},
}

var seedGroups = map[string][]int{"G01": {0, 1}, "G23": {2, 3}}

var migProfiles = []wantProfile{
	{resource: "kyb.ai/gpu-1x-seat", name: "1x", size: 1, seats: 1},
	{resource: "kyb.ai/mig-1g.10gb", name: "mig-1g-10gb", size: 1, seats: 1},
}

var hostUsr = map[string]string{"/usr": "/driver-root/usr"}

var cases = []chartCase{
	{
		name:     "default",
		extended: true, seamless: true, driverMount: hostUsr,
	},
	{
		name:     "seed example",
		files:    []string{"../kyb-dra-driver/examples/seed-values.yaml"},
		extended: true, seamless: true, driverMount: hostUsr,
		profiles: seedProfiles, groups: seedGroups,
	},
	{
		name:       "device-plugin shim",
		files:      []string{"../kyb-dra-driver/examples/device-plugin-values.yaml"},
		deviceMode: true, driverMount: hostUsr,
		profiles: seedProfiles, groups: seedGroups,
	},
	{
		name:     "overprovisioning and every config field",
		files:    []string{"testdata/overprovision-values.yaml"},
		extended: true, seamless: true, driverMount: hostUsr,
		profiles: []wantProfile{
			{resource: "kyb.ai/gpu-1x-seat", name: "1x", size: 1, seats: 8, overprovision: true},
			{resource: "kyb.ai/gpu-2x-seat", name: "2x", size: 2, seats: 2, overprovision: true},
			{resource: "example.com/quad", name: "quad", size: 4, seats: 1},
			{resource: "kyb.ai/gpu-8x-seat", name: "8x", size: 8, seats: 1},
		},
		groups: map[string][]int{"pair-a": {0, 1}, "quad-a": {0, 1, 2, 3}},
	},
	{
		name:     "extended resources off",
		files:    []string{"../kyb-dra-driver/examples/seed-values.yaml"},
		set:      []string{"deviceClasses.extendedResourceName=false"},
		seamless: true, driverMount: hostUsr,
		profiles: seedProfiles, groups: seedGroups,
	},
	{
		name:     "simulated node",
		files:    []string{"../kyb-dra-driver/examples/simulated-values.yaml"},
		extended: true, seamless: true, simulated: true,
	},
	{
		name:       "privileged, without seamless upgrades",
		set:        []string{"gpuAccess=privileged", "kubeletPlugin.seamlessUpgrade=false"},
		extended:   true,
		privileged: true, driverMount: hostUsr,
	},
	{
		name:     "MPS",
		files:    []string{"testdata/mps-values.yaml"},
		extended: true, seamless: true, driverMount: hostUsr,
		privileged: true, mps: true,
		profiles: []wantProfile{{resource: "kyb.ai/gpu-1x-seat", name: "1x", size: 1, seats: 4, sharing: "mps"}, {resource: "kyb.ai/gpu-2x-seat", name: "2x", size: 2, seats: 2, sharing: "timeSlicing/Long"}},
	},
	{
		name:     "MPS with a control command of its own",
		files:    []string{"testdata/mps-values.yaml"},
		set:      []string{"mps.control=chroot /host nvidia-cuda-mps-control"},
		extended: true, seamless: true, driverMount: hostUsr,
		privileged: true, mps: true, mpsControl: "chroot /host nvidia-cuda-mps-control",
		profiles: []wantProfile{{resource: "kyb.ai/gpu-1x-seat", name: "1x", size: 1, seats: 4, sharing: "mps"}, {resource: "kyb.ai/gpu-2x-seat", name: "2x", size: 2, seats: 2, sharing: "timeSlicing/Long"}},
	},
	{
		name:     "MPS with unbounded shm directories",
		files:    []string{"testdata/mps-values.yaml"},
		set:      []string{"mps.shmSizeMiB=unbounded"},
		extended: true, seamless: true, driverMount: hostUsr,
		privileged: true, mps: true, mpsShm: "unbounded",
		profiles: []wantProfile{{resource: "kyb.ai/gpu-1x-seat", name: "1x", size: 1, seats: 4, sharing: "mps"}, {resource: "kyb.ai/gpu-2x-seat", name: "2x", size: 2, seats: 2, sharing: "timeSlicing/Long"}},
	},
	{
		name:       "MPS with the device-plugin shim",
		files:      []string{"testdata/mps-values.yaml"},
		set:        []string{"mode=device-plugin"},
		deviceMode: true, driverMount: hostUsr,
		privileged: true, mps: true,
		profiles: []wantProfile{{resource: "kyb.ai/gpu-1x-seat", name: "1x", size: 1, seats: 4, sharing: "mps"}, {resource: "kyb.ai/gpu-2x-seat", name: "2x", size: 2, seats: 2, sharing: "timeSlicing/Long"}},
	},
	{
		name:     "sized MPS seats",
		files:    []string{"testdata/sized-values.yaml"},
		extended: true, seamless: true, driverMount: hostUsr,
		privileged: true, mps: true,
		profiles: []wantProfile{{resource: "kyb.ai/gpu-1x-seat", name: "1x", size: 1, seats: 4, sharing: "mps"}, {resource: "kyb.ai/gpu-1x-sized", name: "1x-sized", size: 1, seats: 8, sharing: "mps/sized"}},
	},
	{
		name:     "MIG",
		files:    []string{"testdata/mig-values.yaml"},
		extended: true, seamless: true, driverMount: hostUsr,
		privileged: true, mig: true,
		profiles: migProfiles,
	},
	{
		name:       "MIG with the device-plugin shim",
		files:      []string{"testdata/mig-values.yaml"},
		set:        []string{"mode=device-plugin"},
		deviceMode: true, driverMount: hostUsr,
		privileged: true, mig: true,
		profiles: migProfiles,
	},
	{
		// gpuAccess=privileged asks the NVIDIA runtime for nothing
		// either; the chart says so all the same.
		name:     "MIG, privileged",
		files:    []string{"testdata/mig-values.yaml"},
		set:      []string{"gpuAccess=privileged"},
		extended: true, seamless: true, driverMount: hostUsr,
		privileged: true, mig: true,
		profiles: migProfiles,
	},
	{
		// A simulated node's MIG instances need nothing of the host.
		name:     "MIG on a simulated node",
		files:    []string{"../kyb-dra-driver/examples/simulated-values.yaml", "testdata/mig-values.yaml"},
		extended: true, seamless: true, simulated: true,
		profiles: migProfiles,
	},
	{
		name: "monitoring: ServiceMonitor, PodMonitor, dashboard",
		set: []string{"metrics.serviceMonitor.create=true", "metrics.podMonitor.create=true",
			"metrics.dashboard.create=true", "metrics.dashboard.namespace=monitoring"},
		extended: true, seamless: true, driverMount: hostUsr, monitoring: true,
	},
	{
		name:     "per-pod GPU metrics off",
		set:      []string{"metrics.podGPU.enabled=false"},
		extended: true, seamless: true, driverMount: hostUsr, noPodGPU: true,
	},
	{
		name:     "kubelet root directory moved (k0s)",
		set:      []string{"kubeletRootDir=/var/lib/k0s/kubelet"},
		extended: true, seamless: true, driverMount: hostUsr, kubeletRoot: "/var/lib/k0s/kubelet",
	},
	{
		// The kubelet's device manager listens in /var/lib/kubelet/device-plugins
		// whatever its root directory.
		name:       "device-plugin shim, kubelet root directory moved (k0s)",
		files:      []string{"../kyb-dra-driver/examples/device-plugin-values.yaml"},
		set:        []string{"kubeletRootDir=/var/lib/k0s/kubelet"},
		deviceMode: true, driverMount: hostUsr, kubeletRoot: "/var/lib/k0s/kubelet",
		profiles: seedProfiles, groups: seedGroups,
	},
	{
		name:     "driver container of the GPU operator",
		set:      []string{"nvidiaDriver.root=/run/nvidia/driver", "nvidiaDriver.mountSubdirectories={.}"},
		extended: true, seamless: true,
		driverMount: map[string]string{"/run/nvidia/driver": "/driver-root"},
	},
}

func TestChart(t *testing.T) {
	helmBinary(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lintArgs := append([]string{"lint", "--strict", chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, valueArgs(tc.files, tc.set)...)
			if out, stderr, err := runHelm(t, lintArgs...); err != nil {
				t.Fatalf("helm lint: %v\n%s%s", err, out, stderr)
			}
			m := render(t, tc.files, tc.set...)
			t.Run("every object decodes strictly and carries the standard labels", func(t *testing.T) { checkObjects(t, m) })
			t.Run("the ConfigMap loads as the configured NodeConfig", func(t *testing.T) { checkConfigMap(t, m, tc) })
			t.Run("DeviceClasses match kyb-dra-plugin plan", func(t *testing.T) { checkDeviceClasses(t, m, tc) })
			t.Run("RBAC and admission policies", func(t *testing.T) { checkRBAC(t, m, tc) })
			t.Run("pod security", func(t *testing.T) { checkPodSecurity(t, m, tc) })
			t.Run("host paths", func(t *testing.T) { checkHostPaths(t, m, tc) })
			t.Run("upgrade strategy", func(t *testing.T) { checkUpgrade(t, m, tc) })
			t.Run("probes and ports", func(t *testing.T) { checkProbes(t, m, tc) })
			t.Run("doctor init container", func(t *testing.T) { checkDoctor(t, m, tc) })
			t.Run("NOTES", func(t *testing.T) { checkNotes(t, tc) })
			t.Run("monitoring", func(t *testing.T) { checkMonitoring(t, m, tc) })
		})
	}
}

func checkObjects(t *testing.T, m *manifest) {
	typed := map[string]func() any{
		"ConfigMap":                        func() any { return &corev1.ConfigMap{} },
		"ServiceAccount":                   func() any { return &corev1.ServiceAccount{} },
		"Service":                          func() any { return &corev1.Service{} },
		"ResourceQuota":                    func() any { return &corev1.ResourceQuota{} },
		"DaemonSet":                        func() any { return &appsv1.DaemonSet{} },
		"ClusterRole":                      func() any { return &rbacv1.ClusterRole{} },
		"ClusterRoleBinding":               func() any { return &rbacv1.ClusterRoleBinding{} },
		"Role":                             func() any { return &rbacv1.Role{} },
		"RoleBinding":                      func() any { return &rbacv1.RoleBinding{} },
		"NetworkPolicy":                    func() any { return &networkingv1.NetworkPolicy{} },
		"DeviceClass":                      func() any { return &resourcev1.DeviceClass{} },
		"ValidatingAdmissionPolicy":        func() any { return &admissionv1.ValidatingAdmissionPolicy{} },
		"ValidatingAdmissionPolicyBinding": func() any { return &admissionv1.ValidatingAdmissionPolicyBinding{} },
	}
	for _, o := range m.objects {
		newObj, ok := typed[o.Kind]
		if !ok {
			if o.Kind != "ServiceMonitor" && o.Kind != "PodMonitor" {
				t.Errorf("unexpected kind %s (%s)", o.Kind, o.Name)
			}
			continue
		}
		decode(t, o, newObj())
		labels, _ := o.Contents["metadata"].(map[string]any)["labels"].(map[string]any)
		for _, key := range []string{"helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of"} {
			if labels[key] == nil {
				t.Errorf("%s %s lacks the label %s", o.Kind, o.Name, key)
			}
		}
	}
}

func checkConfigMap(t *testing.T, m *manifest, tc chartCase) {
	var cm corev1.ConfigMap
	decode(t, nodeConfigMap(t, m), &cm)
	data := cm.Data["config.yaml"]
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(data), "config.yaml")
	if err != nil {
		t.Fatalf("LoadNodeConfig of the ConfigMap's config.yaml: %v\n%s", err, data)
	}
	// The whole ConfigMap is a valid --config too (as NOTES suggests).
	if _, _, err := v1alpha1.LoadNodeConfig(nodeConfigMap(t, m).Raw, "configmap.yaml"); err != nil {
		t.Errorf("LoadNodeConfig of the ConfigMap manifest: %v", err)
	}
	var got []wantProfile
	for _, p := range cfg.Profiles {
		w := wantProfile{resource: p.Resource, name: p.Name, size: p.Size(), seats: p.Seats(), overprovision: p.AllowOverprovision}
		if p.Sharing != nil {
			w.sharing = string(p.SharingStrategy())
			if i := p.TimeSliceInterval(); i != "" {
				w.sharing += "/" + string(i)
			}
			if p.IsSized() {
				w.sharing += "/sized"
			}
		}
		got = append(got, w)
	}
	if !reflect.DeepEqual(got, tc.profiles) {
		t.Errorf("profiles:\n got %+v\nwant %+v", got, tc.profiles)
	}
	groups := map[string][]int{}
	for _, g := range cfg.Groups {
		groups[g.Name] = g.GPUs
	}
	if len(groups) == 0 {
		groups = nil
	}
	if !reflect.DeepEqual(groups, tc.groups) {
		t.Errorf("groups: got %v, want %v", groups, tc.groups)
	}
}

// planDeviceClasses runs `kyb-dra-plugin plan -o deviceclasses` on a
// simulated 8-GPU node with the configuration the chart rendered.
func planDeviceClasses(t *testing.T, config string) map[string]resourcev1.DeviceClassSpec {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := app.Run(context.Background(), []string{"plan", "--simulate", "dgx-h100", "--config", path, "-o", "deviceclasses"},
		func(string) string { return "" }, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("kyb-dra-plugin plan: exit %d: %s", code, stderr.String())
	}
	planned, err := parseManifest(stdout.String())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]resourcev1.DeviceClassSpec{}
	for _, o := range planned.ofKind("DeviceClass") {
		var dc resourcev1.DeviceClass
		decode(t, o, &dc)
		out[dc.Name] = dc.Spec
	}
	return out
}

func checkDeviceClasses(t *testing.T, m *manifest, tc chartCase) {
	rendered := m.ofKind("DeviceClass")
	if tc.deviceMode {
		if len(rendered) != 0 {
			t.Errorf("the device-plugin mode renders %d DeviceClasses, want none (the cluster may not have resource.k8s.io)", len(rendered))
		}
		return
	}
	var cm corev1.ConfigMap
	decode(t, nodeConfigMap(t, m), &cm)
	want := planDeviceClasses(t, cm.Data["config.yaml"])
	if !tc.extended {
		for name, spec := range want {
			spec.ExtendedResourceName = nil
			want[name] = spec
		}
	}
	got := map[string]resourcev1.DeviceClassSpec{}
	for _, o := range rendered {
		var dc resourcev1.DeviceClass
		decode(t, o, &dc)
		got[dc.Name] = dc.Spec
	}
	if len(want) == 0 {
		t.Fatal("plan printed no DeviceClasses")
	}
	if !reflect.DeepEqual(got, want) {
		gotYAML, _ := sigsyaml.Marshal(got)
		wantYAML, _ := sigsyaml.Marshal(want)
		t.Errorf("the chart's DeviceClasses differ from `kyb-dra-plugin plan -o deviceclasses`:\nchart:\n%s\nplan:\n%s", gotYAML, wantYAML)
	}
	if tc.profiles == nil {
		names := slices.Sorted(func(yield func(string) bool) {
			for n := range got {
				if !yield(n) {
					return
				}
			}
		})
		if want := []string{"gpu-1x-seat.kyb.ai", "gpu-2x-seat.kyb.ai", "gpu-4x-seat.kyb.ai"}; !reflect.DeepEqual(names, want) {
			t.Errorf("default DeviceClasses %v, want %v", names, want)
		}
	}
}

// The rules the plugin needs, and no more; README "RBAC" says which code
// calls each.
var wantClusterRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"list", "watch", "create", "update", "delete"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get", "list"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"patch"}},
	{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, ResourceNames: []string{"gpu.kyb.ai"}, Verbs: []string{"associated-node:patch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
}

func checkRBAC(t *testing.T, m *manifest, tc chartCase) {
	rbacKinds := []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
	if tc.deviceMode {
		for _, kind := range rbacKinds {
			if objs := m.ofKind(kind); len(objs) > 0 {
				t.Errorf("the device-plugin shim calls no API, but the chart renders a %s (%s)", kind, objs[0].Name)
			}
		}
		return
	}
	sa := "kyb-kyb-dra-driver"
	var cr rbacv1.ClusterRole
	decode(t, m.one(t, "ClusterRole"), &cr)
	// The same with or without the per-pod GPU metrics: they read the
	// node, not the API (no pods rule, in any mode).
	want := wantClusterRules
	if !reflect.DeepEqual(cr.Rules, want) {
		t.Errorf("ClusterRole rules:\n got %+v\nwant %+v", cr.Rules, want)
	}
	var crb rbacv1.ClusterRoleBinding
	decode(t, m.one(t, "ClusterRoleBinding"), &crb)
	if crb.RoleRef.Name != cr.Name || len(crb.Subjects) != 1 || crb.Subjects[0].Name != sa || crb.Subjects[0].Namespace != namespace {
		t.Errorf("ClusterRoleBinding binds %v to %+v", crb.RoleRef, crb.Subjects)
	}
	// Events go to the Node's ("default") and to the claims' namespaces:
	// the ClusterRole holds them, and no namespaced Role is needed.
	if roles := append(m.ofKind("Role"), m.ofKind("RoleBinding")...); len(roles) > 0 {
		t.Errorf("namespaced RBAC rendered: %s", roles[0].Name)
	}
	policies := m.ofKind("ValidatingAdmissionPolicy")
	bindings := m.ofKind("ValidatingAdmissionPolicyBinding")
	if len(policies) != 3 || len(bindings) != 3 {
		t.Fatalf("%d admission policies and %d bindings, want 3 and 3", len(policies), len(bindings))
	}
	for i := range bindings {
		var b admissionv1.ValidatingAdmissionPolicyBinding
		decode(t, bindings[i], &b)
		if b.Spec.PolicyName != policies[i].Name || !reflect.DeepEqual(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
			t.Errorf("binding %s: policy %q, actions %v", b.Name, b.Spec.PolicyName, b.Spec.ValidationActions)
		}
	}
}

func daemonSet(t *testing.T, m *manifest) *appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	decode(t, m.one(t, "DaemonSet"), &ds)
	if len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(ds.Spec.Template.Spec.Containers))
	}
	return &ds
}

func env(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

func checkUpgrade(t *testing.T, m *manifest, tc chartCase) {
	ds := daemonSet(t, m)
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil {
		t.Fatalf("update strategy %+v", ds.Spec.UpdateStrategy)
	}
	surge, unavailable := ru.MaxSurge.String(), ru.MaxUnavailable.String()
	podUID, hasPodUID := env(ds.Spec.Template.Spec.Containers[0])["POD_UID"]
	if tc.seamless {
		if surge != "1" || unavailable != "0" {
			t.Errorf("seamless upgrade: maxSurge %s, maxUnavailable %s; want 1 and 0", surge, unavailable)
		}
		if !hasPodUID || podUID.ValueFrom == nil || podUID.ValueFrom.FieldRef.FieldPath != "metadata.uid" {
			t.Errorf("POD_UID must come from metadata.uid: %+v", podUID)
		}
		return
	}
	if surge != "0" || unavailable != "1" {
		t.Errorf("maxSurge %s, maxUnavailable %s; want 0 and 1", surge, unavailable)
	}
	if hasPodUID {
		t.Error("POD_UID is set without seamless upgrades")
	}
}

func checkProbes(t *testing.T, m *manifest, tc chartCase) {
	ds := daemonSet(t, m)
	c := ds.Spec.Template.Spec.Containers[0]
	e := env(c)
	if tc.deviceMode {
		if c.Command[0] != "/usr/local/bin/kyb-device-plugin" {
			t.Errorf("command %v", c.Command)
		}
		if e["DEVICE_PLUGIN_DIRECTORY_PATH"].Value != "/var/lib/kubelet/device-plugins/" {
			t.Errorf("DEVICE_PLUGIN_DIRECTORY_PATH=%q", e["DEVICE_PLUGIN_DIRECTORY_PATH"].Value)
		}
		return
	}
	if c.Command[0] != "/usr/local/bin/kyb-dra-plugin" {
		t.Errorf("command %v", c.Command)
	}
	if e["HEALTHCHECK_PORT"].Value != "51515" {
		t.Errorf("HEALTHCHECK_PORT=%q", e["HEALTHCHECK_PORT"].Value)
	}
	if a := e["HEALTHCHECK_ADDRESS"]; a.ValueFrom == nil || a.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("HEALTHCHECK_ADDRESS must be the pod IP, where the kubelet's gRPC probes connect: %+v", a)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != 51515 {
			t.Errorf("%s probe %+v, want gRPC on 51515", name, p)
		}
	}
	if e["METRICS_ADDRESS"].Value != ":8080" {
		t.Errorf("METRICS_ADDRESS=%q", e["METRICS_ADDRESS"].Value)
	}
}

func checkNotes(t *testing.T, tc chartCase) {
	args := append([]string{"install", releaseName, chartDir, "--namespace", namespace, "--dry-run=client"}, valueArgs(tc.files, tc.set)...)
	out, stderr, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm install --dry-run=client: %v\n%s", err, stderr)
	}
	_, notes, ok := strings.Cut(out, "NOTES:\n")
	if !ok {
		t.Fatalf("no NOTES in:\n%s", out)
	}
	want := []string{"kubectl -n kyb-system rollout status daemonset/kyb-kyb-dra-driver-kubelet-plugin", "kubectl get resourceslices", "kyb-dra-plugin plan --config node-config.yaml", "deviceClassName: gpu-1x-seat.kyb.ai"}
	if tc.deviceMode {
		want = []string{"daemonset/kyb-kyb-dra-driver-device-plugin", `resources.limits: {"kyb.ai/gpu-1x-seat": 1}`}
	}
	const migNote = "A profile uses MIG: the node agent runs privileged"
	if tc.mig {
		want = append(want, migNote)
	} else if strings.Contains(notes, migNote) {
		t.Errorf("NOTES speak of MIG without a MIG profile on real GPUs:\n%s", notes)
	}
	for _, w := range want {
		if !strings.Contains(notes, w) {
			t.Errorf("NOTES lack %q:\n%s", w, notes)
		}
	}
}
