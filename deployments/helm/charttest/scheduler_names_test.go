//go:build charttest

package charttest

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// Every object the chart renders with the scheduler on has a name of its
// own per kind and namespace, also where the release's name and namespace
// are long enough for the 63-character truncation to cut the suffixes
// ("-scheduler", "-scheduler-authentication-reader") off.
func TestSchedulerObjectNamesStayApartWithLongNames(t *testing.T) {
	for _, tc := range []struct {
		name, release, ns string
		set               []string
	}{
		{name: "long release and namespace", release: "gpu-platform-production", ns: "gpu-platform-production-system"},
		{name: "63-character fullnameOverride", release: "kyb", ns: "kyb-system", set: []string{"fullnameOverride=" + strings.Repeat("a", 63)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", tc.release, chartDir, "--namespace", tc.ns, "--kube-version", kubeVersion,
				"--set", "scheduler.enabled=true"}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
			}
			m, err := parseManifest(out)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]string{}
			for _, o := range m.objects {
				meta, _ := o.Contents["metadata"].(map[string]any)
				ns, _ := meta["namespace"].(string)
				key := fmt.Sprintf("%s %s/%s", o.Kind, ns, o.Name)
				what := component(o)
				if roleRef, ok := o.Contents["roleRef"].(map[string]any); ok {
					what += fmt.Sprintf(" (roleRef %v)", roleRef["name"])
				}
				if prev, dup := seen[key]; dup {
					t.Errorf("two objects %s: %s and %s; one replaces or refuses the other", key, prev, what)
				}
				seen[key] = what
			}
		})
	}
}

// A kube-scheduler flag in scheduler.extraArgs that the chart also sets
// comes after the chart's own and wins (the last value of a flag counts).
// The chart must then either refuse it or follow it: probes on the port
// the process listens on, a Role for the lease it elects on, and no
// replicas without leader election.
func TestSchedulerExtraArgsCannotOverrideTheChartsFlags(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   []string
		check func(t *testing.T, m *manifest)
	}{
		{
			name: "--secure-port",
			set:  []string{"scheduler.extraArgs={--secure-port=10300}"},
			check: func(t *testing.T, m *manifest) {
				var dep appsv1.Deployment
				decode(t, m.one(t, "Deployment"), &dep)
				c := dep.Spec.Template.Spec.Containers[0]
				if c.Ports[0].ContainerPort != 10300 {
					t.Errorf("kyb-scheduler listens on 10300 (args %q) but the probes' port https is %d: liveness fails and the pod restarts forever", c.Args, c.Ports[0].ContainerPort)
				}
			},
		},
		{
			name: "--leader-elect-resource-name",
			set:  []string{"scheduler.extraArgs={--leader-elect-resource-name=other-lease}"},
			check: func(t *testing.T, m *manifest) {
				for _, o := range m.ofKind("Role") {
					if !strings.HasSuffix(o.Name, "-scheduler-lease") {
						continue
					}
					var role rbacv1.Role
					decode(t, o, &role)
					for _, r := range role.Rules {
						for _, n := range r.ResourceNames {
							if n == "other-lease" {
								return
							}
						}
					}
					t.Errorf("kyb-scheduler elects on the lease other-lease but the Role %s allows only %+v: it never leads", o.Name, role.Rules)
				}
			},
		},
		{
			name: "--leader-elect=false with two replicas",
			set:  []string{"scheduler.replicas=2", "scheduler.extraArgs={--leader-elect=false}"},
			check: func(t *testing.T, m *manifest) {
				var dep appsv1.Deployment
				decode(t, m.one(t, "Deployment"), &dep)
				t.Errorf("rendered %d replicas with args %q: both schedule, and bind the same pods", *dep.Spec.Replicas, dep.Spec.Template.Spec.Containers[0].Args)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", releaseName, chartDir, "--namespace", namespace, "--kube-version", kubeVersion},
				valueArgs(nil, append([]string{"scheduler.enabled=true"}, tc.set...))...)
			out, _, err := runHelm(t, args...)
			if err != nil {
				return // refused: fine
			}
			m, err := parseManifest(out)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, m)
		})
	}
}
