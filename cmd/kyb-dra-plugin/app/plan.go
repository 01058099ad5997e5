package app

import (
	"context"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planview"
)

const planUsage = `Usage: kyb-dra-plugin plan [flags]

Prints what the plugin would make of this node: the GPUs and their links,
the profiles, and the groups and seats in the order the scheduler tries them.
With -o resourceslices it prints the exact ResourceSlices the plugin would
publish; with -o deviceclasses the DeviceClasses of the profiles.

  kyb-dra-plugin plan --simulate dgx-h100
  kyb-dra-plugin plan --simulate nvlink-2x4 --config node-config.yaml -o yaml

Flags:
`

// Plan runs the plan subcommand and returns its exit code.
func Plan(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	f := cli.NewFlagSet("kyb-dra-plugin plan", stderr)
	var src nodesetup.Flags
	src.AddFlags(f, "node-1")
	output := cli.NewOneOf("table", "table", "yaml", "json", "resourceslices", "deviceclasses")
	f.Var(output, "o", "", "output format: table, yaml, json, resourceslices or deviceclasses")
	f.Var(output, "output", "", "same as -o")
	layout := cli.NewOneOf(string(draresources.LayoutShared), string(draresources.LayoutShared), string(draresources.LayoutPerSeat))
	f.Var(layout, "device-layout", "", "layout of -o resourceslices: shared (one shared device per group) or per-seat (the fallback for clusters without consumable capacity)")
	if code, ok := f.ParseOrExit(args, getenv, planUsage); !ok {
		return code
	}
	node, err := src.Open(ctx)
	if err != nil {
		return f.Fail(cli.ExitFailed, err)
	}
	defer node.Close(ctx)
	if err := writePlan(stdout, output.Value(), draresources.Layout(layout.Value()), src.NodeName, node); err != nil {
		return f.Fail(cli.ExitFailed, err)
	}
	return cli.ExitOK
}

func writePlan(w io.Writer, output string, layout draresources.Layout, nodeName string, node *nodesetup.Node) error {
	switch output {
	case "table":
		return planview.WriteTable(w, nodeName, node.Host.Description, node.Inv, node.Plan)
	case "yaml":
		return planview.WriteYAML(w, planview.NewView(nodeName, node.Host.Description, node.Inv, node.Plan))
	case "json":
		return planview.WriteJSON(w, planview.NewView(nodeName, node.Host.Description, node.Inv, node.Plan))
	default:
		return writeDRAObjects(w, output, nodeName, layout, node)
	}
}

// writeDRAObjects prints the DRA objects of a plan as a YAML stream.
func writeDRAObjects(w io.Writer, kind, nodeName string, layout draresources.Layout, node *nodesetup.Node) error {
	var objs []runtime.Object
	switch kind {
	case "resourceslices":
		res := draresources.Resources(node.Plan, node.Inv, nodeName, layout)
		if err := draresources.CheckPoolBounds(res, layout); err != nil {
			return err
		}
		for _, s := range draresources.ResourceSlices(res, nodeName) {
			objs = append(objs, s)
		}
	case "deviceclasses":
		for _, dc := range draresources.DeviceClasses(node.Plan.Profiles, draresources.DeviceClassOptions{ExtendedResources: true}) {
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
