package e2enode

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// releaseObjects are the objects of the release's manifest, as
// "Kind namespace/name" keys with the objects themselves.
func (h *helmNode) releaseObjects(t *testing.T) map[string]*unstructured.Unstructured {
	t.Helper()
	manifest := h.run(t, "get", "manifest", helmRelease, "--namespace", helmNamespace)
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	out := map[string]*unstructured.Unstructured{}
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("the release's manifest: %v", err)
		}
		if len(raw) == 0 {
			continue
		}
		o := &unstructured.Unstructured{Object: raw}
		out[o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()] = o
	}
}

// remaining returns which of objs the API server still has.
func (h *helmNode) remaining(t *testing.T, objs map[string]*unstructured.Unstructured) []string {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(h.c.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(h.c.Config)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for key, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Get(h.c.Ctx, o.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			left = append(left, key)
		}
	}
	slices.Sort(left)
	return left
}

// nodeFiles lists the files under dir, relative to it, with "(empty)" for
// none.
func nodeFiles(dir string) string {
	var files []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, rel)
		}
		return nil
	})
	if len(files) == 0 {
		return "(empty)"
	}
	var b bytes.Buffer
	for _, f := range files {
		b.WriteString("\n    " + f)
	}
	return b.String()
}
