package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planview"
)

// nodeSource are the flags that say which node to look at and with which
// configuration; the plugin, the shim and `plan` share them.
type nodeSource struct {
	nodeName   string
	configPath string
	simulate   string
	driverRoot string
	devRoot    string
	sysfsRoot  string
}

func (s *nodeSource) register(f *flags, defaultNode string) {
	f.StringVar(&s.nodeName, "node-name", defaultNode, "name of the Kubernetes node this runs on")
	f.bind("node-name", "NODE_NAME")
	f.StringVar(&s.configPath, "config", "", "node configuration file (kind NodeConfig, or a ConfigMap carrying it under data.config.yaml); empty: the defaults")
	f.bind("config", "KYB_CONFIG")
	f.StringVar(&s.simulate, "simulate", "", "serve a simulated node instead of the NVIDIA driver: a preset (dgx-h100, dgx-a100, nvlink-2x4, pcie-8gpu, workstation-2gpu, single-gpu) or a NodeTopology file")
	f.bind("simulate", "KYB_SIMULATE")
	f.StringVar(&s.driverRoot, "driver-root", "/", "where the NVIDIA driver's files are on the host, as the plugin sees them")
	f.bind("driver-root", "NVIDIA_DRIVER_ROOT")
	f.StringVar(&s.devRoot, "dev-root", "/", "where the host's /dev is, as the plugin sees it")
	f.bind("dev-root", "KYB_DEV_ROOT")
	f.StringVar(&s.sysfsRoot, "sysfs-root", "/sys", "where the host's sysfs is, as the plugin sees it")
	f.bind("sysfs-root", "KYB_SYSFS_ROOT")
}

// loaded is an opened node with its plan.
type loaded struct {
	host   *gpuhost.Host
	inv    *inventory.Inventory
	config *v1alpha1.NodeConfig
	source *v1alpha1.Source
	plan   *planner.Plan
}

// load opens the node, reads the configuration and plans. Every error says
// what to fix: the file and line of a bad config, the preset names for an
// unknown preset, the driver root where NVML is missing.
func (s *nodeSource) load(ctx context.Context) (*loaded, error) {
	cfg := &v1alpha1.NodeConfig{}
	cfg.SetDefaults()
	var src *v1alpha1.Source
	if s.configPath != "" {
		data, err := os.ReadFile(s.configPath)
		if err != nil {
			return nil, fmt.Errorf("read node configuration: %w", err)
		}
		cfg, src, err = v1alpha1.LoadNodeConfig(data, s.configPath)
		if err != nil {
			return nil, fmt.Errorf("node configuration is invalid:\n%w", err)
		}
		for _, note := range src.Notes {
			klog.FromContext(ctx).Info("Node configuration", "file", s.configPath, "note", note)
		}
	}
	host, err := gpuhost.Open(ctx, gpuhost.Options{Simulate: s.simulate, NodeName: s.nodeName, DriverRoot: s.driverRoot, DevRoot: s.devRoot, SysfsRoot: s.sysfsRoot})
	if err != nil {
		return nil, err
	}
	inv, err := inventory.Discover(ctx, host.NVML, host.PCIe)
	if err != nil {
		host.Close()
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		host.Close()
		var fe v1alpha1.FieldErrors
		if errors.As(err, &fe) && src != nil {
			err = src.Annotate(fe)
		}
		return nil, fmt.Errorf("node configuration does not fit this node (%s):\n%w", inv.Summary(), err)
	}
	return &loaded{host: host, inv: inv, config: cfg, source: src, plan: plan}, nil
}

const planUsage = `Usage: kyb-dra-plugin plan [flags]

Prints what the plugin would make of this node: the GPUs and their links,
the profiles, and the groups and seats in the order the scheduler tries them.
With -o resourceslices it prints the exact ResourceSlices the plugin would
publish; with -o deviceclasses the DeviceClasses of the profiles.

  kyb-dra-plugin plan --simulate dgx-h100
  kyb-dra-plugin plan --simulate nvlink-2x4 --config node-config.yaml -o yaml

Flags:
`

// Plan runs the plan subcommand.
func Plan(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	f := newFlags("plan", stderr)
	var src nodeSource
	src.register(f, "node-1")
	output := &oneOf{value: "table", allowed: []string{"table", "yaml", "json", "resourceslices", "deviceclasses"}}
	f.Var(output, "o", "output format: table, yaml, json, resourceslices or deviceclasses")
	f.Var(output, "output", "same as -o")
	layout := &oneOf{value: "shared", allowed: []string{"shared", "per-seat"}}
	f.Var(layout, "device-layout", "layout of -o resourceslices: shared (one shared device per group) or per-seat (the fallback for clusters without consumable capacity)")
	if err := f.parse(args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage(planUsage)
			return 0
		}
		fmt.Fprintf(stderr, "kyb-dra-plugin plan: %v\nRun 'kyb-dra-plugin plan -h' for the flags.\n", err)
		return 2
	}
	node, err := src.load(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "kyb-dra-plugin plan: %v\n", err)
		return 1
	}
	defer node.host.Close()

	switch output.value {
	case "table":
		err = planview.WriteTable(stdout, src.nodeName, node.host.Description, node.inv, node.plan)
	case "yaml":
		err = planview.WriteYAML(stdout, planview.NewView(src.nodeName, node.host.Description, node.inv, node.plan))
	case "json":
		err = planview.WriteJSON(stdout, planview.NewView(src.nodeName, node.host.Description, node.inv, node.plan))
	default:
		err = writeDRAObjects(stdout, output.value, src.nodeName, draresources.Layout(layout.value), node)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kyb-dra-plugin plan: %v\n", err)
		return 1
	}
	return 0
}
