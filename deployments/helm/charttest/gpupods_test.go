//go:build charttest

package charttest

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
)

// gpuPodPolicies are the admission policies of values scheduler.gpuPods:
// the mutating one that gives kyb-scheduler the pods that name no
// scheduler, and the validating one that refuses those that name another.
type gpuPodPolicies struct {
	mutating        *admissionv1.MutatingAdmissionPolicy
	mutatingBinding *admissionv1.MutatingAdmissionPolicyBinding
	validating      *admissionv1.ValidatingAdmissionPolicy
	validatingBind  *admissionv1.ValidatingAdmissionPolicyBinding
	apiVersion      string // the mutating policy's
}

const gpuPodsPolicyName = "kyb-kyb-dra-driver-kyb-system-gpu-pods"

// renderGPUPodPolicies renders the chart and returns its scheduler.gpuPods
// policies; nil members where it renders none.
func renderGPUPodPolicies(t *testing.T, kube string, set ...string) gpuPodPolicies {
	t.Helper()
	args := append([]string{"template", releaseName, chartDir, "--namespace", namespace, "--kube-version", kube}, valueArgs(nil, set)...)
	out, stderr, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	m, err := parseManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	var p gpuPodPolicies
	for _, o := range m.objects {
		if o.Name != gpuPodsPolicyName {
			continue
		}
		switch o.Kind {
		case "MutatingAdmissionPolicy":
			p.mutating = &admissionv1.MutatingAdmissionPolicy{}
			decode(t, o, p.mutating)
			p.apiVersion, _ = o.Contents["apiVersion"].(string)
		case "MutatingAdmissionPolicyBinding":
			p.mutatingBinding = &admissionv1.MutatingAdmissionPolicyBinding{}
			decode(t, o, p.mutatingBinding)
		case "ValidatingAdmissionPolicy":
			p.validating = &admissionv1.ValidatingAdmissionPolicy{}
			decode(t, o, p.validating)
		case "ValidatingAdmissionPolicyBinding":
			p.validatingBind = &admissionv1.ValidatingAdmissionPolicyBinding{}
			decode(t, o, p.validatingBind)
		default:
			t.Errorf("%s %s: a kind the policies do not have", o.Kind, o.Name)
		}
	}
	return p
}

// The policies come with scheduler.enabled and go with
// scheduler.gpuPods.assign=false: a MutatingAdmissionPolicy of
// admissionregistration.k8s.io/v1 (GA since 1.36; v1beta1 for 1.34 and
// 1.35) that sets spec.schedulerName to scheduler.name at the creation of
// a pod, failing closed and again after later mutations, and a
// ValidatingAdmissionPolicy that denies; each bound to all objects.
func TestGPUPodPoliciesComeWithTheScheduler(t *testing.T) {
	helmBinary(t)
	for _, tc := range []struct {
		name       string
		kube       string
		set        []string
		want       bool
		apiVersion string
		scheduler  string
	}{
		{name: "scheduler off", kube: kubeVersion},
		{name: "scheduler on", kube: kubeVersion, set: []string{"scheduler.enabled=true"}, want: true,
			apiVersion: "admissionregistration.k8s.io/v1", scheduler: "kyb-scheduler"},
		{name: "scheduler on, named", kube: kubeVersion, set: []string{"scheduler.enabled=true", "scheduler.name=gpu-scheduler"}, want: true,
			apiVersion: "admissionregistration.k8s.io/v1", scheduler: "gpu-scheduler"},
		{name: "Kubernetes 1.35", kube: "1.35.2", set: []string{"scheduler.enabled=true"}, want: true,
			apiVersion: "admissionregistration.k8s.io/v1beta1", scheduler: "kyb-scheduler"},
		{name: "turned off", kube: kubeVersion, set: []string{"scheduler.enabled=true", "scheduler.gpuPods.assign=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := renderGPUPodPolicies(t, tc.kube, tc.set...)
			if !tc.want {
				if p.mutating != nil || p.mutatingBinding != nil || p.validating != nil || p.validatingBind != nil {
					t.Fatalf("policies %s rendered, want none", gpuPodsPolicyName)
				}
				return
			}
			if p.mutating == nil || p.mutatingBinding == nil || p.validating == nil || p.validatingBind == nil {
				t.Fatalf("policies %s: mutating %v (binding %v), validating %v (binding %v); want all four",
					gpuPodsPolicyName, p.mutating != nil, p.mutatingBinding != nil, p.validating != nil, p.validatingBind != nil)
			}
			if p.apiVersion != tc.apiVersion {
				t.Errorf("MutatingAdmissionPolicy of %s, want %s", p.apiVersion, tc.apiVersion)
			}
			m := p.mutating.Spec
			if m.FailurePolicy == nil || *m.FailurePolicy != admissionv1.Fail || m.ReinvocationPolicy != admissionv1.IfNeededReinvocationPolicy {
				t.Errorf("failurePolicy %v, reinvocationPolicy %q; want Fail, IfNeeded", m.FailurePolicy, m.ReinvocationPolicy)
			}
			checkPodCreate(t, "MutatingAdmissionPolicy", m.MatchConstraints)
			want := "Object{spec: Object.spec{schedulerName: '" + tc.scheduler + "'}}"
			if len(m.Mutations) != 1 || m.Mutations[0].PatchType != admissionv1.PatchTypeApplyConfiguration ||
				m.Mutations[0].ApplyConfiguration == nil || m.Mutations[0].ApplyConfiguration.Expression != want {
				t.Errorf("mutations %+v, want one apply configuration %s", m.Mutations, want)
			}
			if b := p.mutatingBinding.Spec; b.PolicyName != gpuPodsPolicyName || b.MatchResources != nil || b.ParamRef != nil {
				t.Errorf("MutatingAdmissionPolicyBinding %+v, want policy %s for all objects", b, gpuPodsPolicyName)
			}
			v := p.validating.Spec
			if v.FailurePolicy == nil || *v.FailurePolicy != admissionv1.Fail {
				t.Errorf("ValidatingAdmissionPolicy failurePolicy %v, want Fail", v.FailurePolicy)
			}
			checkPodCreate(t, "ValidatingAdmissionPolicy", v.MatchConstraints)
			if b := p.validatingBind.Spec; b.PolicyName != gpuPodsPolicyName || len(b.ValidationActions) != 1 || b.ValidationActions[0] != admissionv1.Deny || b.MatchResources != nil {
				t.Errorf("ValidatingAdmissionPolicyBinding %+v, want Deny of policy %s for all objects", b, gpuPodsPolicyName)
			}
		})
	}
}

// checkPodCreate checks that a policy matches pods at creation only: their
// spec.schedulerName cannot change afterwards.
func checkPodCreate(t *testing.T, kind string, mc *admissionv1.MatchResources) {
	t.Helper()
	if mc == nil || len(mc.ResourceRules) != 1 {
		t.Fatalf("%s matchConstraints %+v, want one rule", kind, mc)
	}
	r := mc.ResourceRules[0]
	if strings.Join(r.APIGroups, ",") != "" || strings.Join(r.APIVersions, ",") != "v1" ||
		strings.Join(r.Resources, ",") != "pods" || len(r.Operations) != 1 || r.Operations[0] != admissionv1.Create {
		t.Errorf("%s rule %+v, want CREATE of core v1 pods", kind, r)
	}
}

// pod is a pod as admission sees it: defaulted, so that a pod that names
// no scheduler names "default-scheduler".
func pod(t *testing.T, scheduler, spec string) map[string]any {
	t.Helper()
	p := obj(t, "spec:\n"+spec)
	s, _ := p["spec"].(map[string]any)
	s["schedulerName"] = scheduler
	return p
}

// Which pods the policies take, evaluated as the API server does (the
// mutating policy's match conditions; the validating policy's match
// conditions and validation, after the mutation): every pod with
// resourceClaims, and every pod asking for an extended resource a
// DeviceClass may serve, in limits or requests, of any container; not pods
// without them, nor pods created bound to a node.
func TestGPUPodPoliciesTakePodsThatMayUseGPUs(t *testing.T) {
	helmBinary(t)
	p := renderGPUPodPolicies(t, kubeVersion, "scheduler.enabled=true", "scheduler.name=gpu-scheduler",
		"nodeConfig.profiles[0].resource=example.com/gpu-1x-seat",
		"scheduler.gpuPods.extendedResources={nvidia.com/gpu}", "scheduler.gpuPods.otherSchedulers={batch-scheduler}")
	if p.mutating == nil || p.validating == nil {
		t.Fatal("the chart renders no scheduler.gpuPods policies with scheduler.enabled")
	}
	mutating := &admissionv1.ValidatingAdmissionPolicy{Spec: admissionv1.ValidatingAdmissionPolicySpec{MatchConditions: p.mutating.Spec.MatchConditions}}
	const app = "  containers: [{name: app, image: app}]\n"
	for _, tc := range []struct {
		name string
		spec string
		gpus bool
	}{
		{"a claim from a template", "  resourceClaims: [{name: gpu, resourceClaimTemplateName: seat}]\n" + app, true},
		{"a claim by name", "  resourceClaims: [{name: gpu, resourceClaimName: shared}]\n" + app, true},
		{"a profile's resource in limits", "  containers: [{name: app, resources: {limits: {example.com/gpu-1x-seat: 1}}}]\n", true},
		{"a profile's resource in requests", "  containers: [{name: app, resources: {requests: {example.com/gpu-1x-seat: 1}}}]\n", true},
		{"in an init container", "  initContainers: [{name: init, resources: {limits: {example.com/gpu-1x-seat: 1}}}]\n" + app, true},
		{"in a second container", "  containers: [{name: app}, {name: side, resources: {limits: {cpu: 1, example.com/gpu-1x-seat: 1}}}]\n", true},
		{"a class's implicit resource", "  containers: [{name: app, resources: {limits: {deviceclass.resource.kubernetes.io/gpu-1x-seat.example.com: 1}}}]\n", true},
		{"another driver's implicit resource", "  containers: [{name: app, resources: {limits: {deviceclass.resource.kubernetes.io/gpu.example.org: 1}}}]\n", true},
		{"a listed extended resource", "  containers: [{name: app, resources: {limits: {nvidia.com/gpu: 1}}}]\n", true},
		{"no resources", app, false},
		{"CPU and memory", "  containers: [{name: app, resources: {requests: {cpu: 1, memory: 1Gi}, limits: {memory: 1Gi}}}]\n", false},
		{"an unlisted extended resource", "  containers: [{name: app, resources: {limits: {example.com/fpga: 1, kyb.ai/gpu-1x-seat: 1}}}]\n", false},
		{"empty resourceClaims", "  resourceClaims: []\n" + app, false},
		{"created bound to a node", "  nodeName: node-a\n  resourceClaims: [{name: gpu, resourceClaimTemplateName: seat}]\n" + app, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Naming no scheduler: the mutating policy takes the pod.
			unset := evaluate(t, mutating, admission{operation: "CREATE", object: pod(t, "default-scheduler", tc.spec)})
			if unset.matched != tc.gpus || unset.denied {
				t.Fatalf("the mutating policy matched %v (denied %v), want %v", unset.matched, unset.denied, tc.gpus)
			}
			// A pod that names kyb-scheduler (or has been given it)
			// passes, and so does one naming a listed scheduler.
			for _, s := range []string{"gpu-scheduler", "batch-scheduler"} {
				if v := evaluate(t, p.validating, admission{operation: "CREATE", object: pod(t, s, tc.spec)}); v.matched != tc.gpus || v.denied {
					t.Errorf("naming %s: the validating policy matched %v, denied %v %q; want matched %v, admitted", s, v.matched, v.denied, v.messages, tc.gpus)
				}
			}
			// A pod that names another scheduler (or keeps the default,
			// where the mutating policy did not run) is refused.
			for _, s := range []string{"volcano", "default-scheduler"} {
				v := evaluate(t, p.validating, admission{operation: "CREATE", object: pod(t, s, tc.spec)})
				if !tc.gpus {
					if v.matched {
						t.Errorf("naming %s: the validating policy matched a pod without GPUs", s)
					}
					continue
				}
				want := `may be scheduled only by gpu-scheduler, batch-scheduler, not by "` + s + `"`
				checkVerdict(t, v, true, true, want)
			}
		})
	}
	// The mutating policy leaves a pod that names a scheduler alone: the
	// validating one decides.
	named := pod(t, "volcano", "  resourceClaims: [{name: gpu, resourceClaimTemplateName: seat}]\n"+app)
	if v := evaluate(t, mutating, admission{operation: "CREATE", object: named}); v.matched {
		t.Error("the mutating policy takes a pod that names scheduler volcano")
	}
}
