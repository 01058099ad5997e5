package command

import (
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// writeDRAObjects prints the DRA objects of a plan as a YAML stream.
func writeDRAObjects(w io.Writer, kind, nodeName string, layout draresources.Layout, node *loaded) error {
	var objs []runtime.Object
	switch kind {
	case "resourceslices":
		res := draresources.Resources(node.plan, node.inv, nodeName, layout)
		for _, s := range draresources.ResourceSlices(res, nodeName) {
			objs = append(objs, s)
		}
	case "deviceclasses":
		for _, dc := range draresources.DeviceClasses(node.plan.Profiles, draresources.DeviceClassOptions{ExtendedResources: true}) {
			objs = append(objs, dc)
		}
	}
	for i, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return fmt.Errorf("render %s: %w", kind, err)
		}
		if i > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}
