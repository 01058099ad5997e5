//go:build charttest

// Package charttest tests the Helm chart deployments/helm/kyb-dra-driver by
// rendering it with a real helm binary and reading what comes out: the
// DeviceClasses against `kyb-dra-plugin plan -o deviceclasses`, the ConfigMap
// against the config loader, RBAC, security context and host paths against
// what the README promises, and the admission policies' CEL against requests.
//
// It needs helm v4 named by the HELM variable and fails without it; `make
// chart-test` builds helm from the Go module proxy and sets HELM. The build
// tag keeps `go test ./...` of the module free of that dependency.
package charttest

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	chartDir    = "../kyb-dra-driver"
	namespace   = "kyb-system"
	releaseName = "kyb"
	kubeVersion = "1.37.0"
)

// helmBinary returns the helm named by $HELM, failing the test without it:
// a chart test that skips would hide a chart nobody checked.
func helmBinary(t *testing.T) string {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Fatal("HELM is not set: the chart tests need helm v4. Run `make chart-test`, which builds helm v4.3.1 from the Go module proxy into _output/bin and sets HELM, or set HELM=/path/to/helm.")
	}
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("HELM=%s: %v", helm, err)
	}
	return helm
}

// runHelm runs helm with its state directories in a temporary directory and
// no cluster, and returns stdout, stderr and the error.
func runHelm(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// valueArgs turns a case's values files and --set pairs into helm flags.
func valueArgs(files []string, set []string) []string {
	var args []string
	for _, f := range files {
		args = append(args, "-f", f)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// render runs helm template and returns the objects, failing on any error.
func render(t *testing.T, files []string, set ...string) *manifest {
	t.Helper()
	args := append([]string{"template", releaseName, chartDir, "--namespace", namespace, "--kube-version", kubeVersion}, valueArgs(files, set)...)
	out, stderr, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	m, err := parseManifest(out)
	if err != nil {
		t.Fatalf("parse the rendered chart: %v\n%s", err, out)
	}
	return m
}

// renderError runs helm template on values that must be refused and
// returns helm's message.
func renderError(t *testing.T, ns string, extra []string, set ...string) string {
	t.Helper()
	args := append([]string{"template", releaseName, chartDir, "--namespace", ns}, extra...)
	args = append(args, valueArgs(nil, set)...)
	out, stderr, err := runHelm(t, args...)
	if err == nil {
		t.Fatalf("helm %s succeeded, want it refused; rendered:\n%s", strings.Join(args, " "), out)
	}
	return stderr
}

// object is one rendered manifest, decoded loosely.
type object struct {
	Kind     string
	Name     string
	Raw      []byte
	Contents map[string]any
}

type manifest struct{ objects []object }

func parseManifest(s string) (*manifest, error) {
	r := yaml.NewYAMLReader(bufio.NewReader(strings.NewReader(s)))
	m := &manifest{}
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return m, nil
		}
		if err != nil {
			return nil, err
		}
		var contents map[string]any
		if err := sigsyaml.Unmarshal(doc, &contents); err != nil {
			return nil, err
		}
		if len(contents) == 0 {
			continue
		}
		kind, _ := contents["kind"].(string)
		meta, _ := contents["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		m.objects = append(m.objects, object{Kind: kind, Name: name, Raw: doc, Contents: contents})
	}
}

// ofKind returns the objects of a kind.
func (m *manifest) ofKind(kind string) []object {
	var out []object
	for _, o := range m.objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// one returns the only object of a kind, failing if there is not exactly one.
func (m *manifest) one(t *testing.T, kind string) object {
	t.Helper()
	objs := m.ofKind(kind)
	if len(objs) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(objs), kind)
	}
	return objs[0]
}

// decode decodes an object strictly into a typed API object: a field the
// API does not have (a typo in a template) fails.
func decode(t *testing.T, o object, into any) {
	t.Helper()
	if err := sigsyaml.UnmarshalStrict(o.Raw, into); err != nil {
		t.Fatalf("%s %s does not decode strictly: %v\n%s", o.Kind, o.Name, err, o.Raw)
	}
}
