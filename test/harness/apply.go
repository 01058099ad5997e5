package harness

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// ApplyOptions say how to create objects.
type ApplyOptions struct {
	// DryRun asks the API server to validate (schema, CEL, admission)
	// without storing anything.
	DryRun bool
	// Namespace for namespaced objects that name none; default "default".
	Namespace string
}

// ApplyFile creates every object of a YAML file (several documents
// allowed) and returns them as created.
func (c *Cluster) ApplyFile(path string, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := c.Apply(data, opts)
	if err != nil {
		return objs, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

// Apply creates every object of a YAML stream.
func (c *Cluster) Apply(data []byte, opts ApplyOptions) ([]*unstructured.Unstructured, error) {
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		if len(raw) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{Object: raw}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return out, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = opts.Namespace
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		create := metav1.CreateOptions{}
		if opts.DryRun {
			create.DryRun = []string{metav1.DryRunAll}
		}
		created, err := ri.Create(c.Ctx, obj, create)
		if err != nil {
			return out, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		out = append(out, created)
	}
}
