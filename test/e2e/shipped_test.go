package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// helmTemplate renders the chart with helm (built from the Go module proxy
// by `make helm`; the make targets pass its path in HELM).
func helmTemplate(t *testing.T, release, namespace string, args ...string) []byte {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Fatal("HELM is not set: run the end-to-end tests through `make e2e` (or `make test`), which builds helm and passes its path")
	}
	cmdArgs := append([]string{"template", release, filepath.Join(repoRoot(), "deployments/helm/kyb-dra-driver"), "--namespace", namespace, "--kube-version", "1.37.1"}, args...)
	out, err := exec.Command(helm, cmdArgs...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(cmdArgs, " "), err, out)
	}
	return out
}

// Every object the product ships is accepted by the real API server:
// first by a server-side dry run (schema, CEL, admission), then for real.
func TestShippedObjectsAreAccepted(t *testing.T) {
	c := harness.Start(t, harness.Options{})
	root := repoRoot()

	files := []string{filepath.Join(root, "deployments/static/deviceclasses.yaml")}
	specs, err := filepath.Glob(filepath.Join(root, "demo/specs/*.yaml"))
	if err != nil || len(specs) < 5 {
		t.Fatalf("demo specs: %v %v", specs, err)
	}
	files = append(files, specs...)
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		t.Run(rel, func(t *testing.T) {
			for _, dry := range []bool{true, false} {
				objs, err := c.ApplyFile(f, harness.ApplyOptions{DryRun: dry})
				if err != nil {
					t.Fatalf("dry run %t: %v", dry, err)
				}
				if len(objs) == 0 {
					t.Fatal("no objects")
				}
			}
		})
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kyb-system"}}
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, "deployments/helm/kyb-dra-driver")
	for _, tc := range []struct {
		name, release string
		args          []string
	}{
		{"chart with the seed's example", "seed", []string{"-f", filepath.Join(chart, "examples/seed-values.yaml"), "--set", "deviceClasses.create=false"}},
		{"chart in device-plugin mode", "shim", []string{"-f", filepath.Join(chart, "examples/device-plugin-values.yaml")}},
		// Last and for real: the default install (its DeviceClasses are the
		// static ones created above, so the chart's are left out).
		{"chart with defaults", "kyb", []string{"--set", "deviceClasses.create=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rendered := helmTemplate(t, tc.release, "kyb-system", tc.args...)
			if _, err := c.Apply(rendered, harness.ApplyOptions{DryRun: true, Namespace: "kyb-system"}); err != nil {
				t.Fatalf("server-side dry run: %v", err)
			}
			if tc.release == "kyb" {
				if _, err := c.Apply(rendered, harness.ApplyOptions{Namespace: "kyb-system"}); err != nil {
					t.Fatalf("create: %v", err)
				}
			}
		})
	}
}
