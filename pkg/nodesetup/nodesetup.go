// Package nodesetup opens what both node daemons serve, from the flags they
// share: the node's GPUs (real NVML or a simulated node), its
// configuration and plan, the GPU health monitor, and how containers get
// the driver's files. The DRA plugin, its `plan` subcommand and the
// device-plugin shim each add their own flags around these.
package nodesetup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// Flags say which node to look at and with which configuration.
type Flags struct {
	NodeName   string
	ConfigPath string
	Simulate   string
	DriverRoot string
	DevRoot    string
	SysfsRoot  string
}

// AddFlags defines the flags; defaultNode is --node-name's default.
func (s *Flags) AddFlags(f *cli.FlagSet, defaultNode string) {
	f.StringVar(&s.NodeName, "node-name", "NODE_NAME", defaultNode, "name of the Kubernetes node this runs on")
	f.StringVar(&s.ConfigPath, "config", "KYB_CONFIG", "", "node configuration file (kind NodeConfig, or a ConfigMap carrying it under data.config.yaml); empty: the defaults")
	f.StringVar(&s.Simulate, "simulate", "KYB_SIMULATE", "", "serve a simulated node instead of the NVIDIA driver: a preset (dgx-h100, dgx-h200, dgx-a100, nvlink-2x4, pcie-8gpu, workstation-2gpu, single-gpu) or a NodeTopology file")
	f.StringVar(&s.DriverRoot, "driver-root", "NVIDIA_DRIVER_ROOT", "/", "where the NVIDIA driver's files are on the host, as the plugin sees them")
	f.StringVar(&s.DevRoot, "dev-root", "KYB_DEV_ROOT", "/", "where the host's /dev is, as the plugin sees it; a device node not there gets its numbers from /proc/devices")
	f.StringVar(&s.SysfsRoot, "sysfs-root", "KYB_SYSFS_ROOT", "/sys", "where the host's sysfs is, as the plugin sees it")
}

// Node is an opened node with its configuration and plan. Close releases
// NVML.
type Node struct {
	Host   *gpuhost.Host
	Inv    *inventory.Inventory
	Config *v1alpha1.NodeConfig
	// Source is where the configuration came from (nil for the defaults),
	// to annotate errors with its lines.
	Source *v1alpha1.Source
	Plan   *planner.Plan
}

// Close shuts NVML down; a failure is logged, since nothing is left to do
// about it.
func (n *Node) Close(ctx context.Context) {
	if err := n.Host.Close(); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot close NVML")
	}
}

// Open opens the node, reads the configuration and plans. Every error says
// what to fix: the file and line of a bad config, the preset names for an
// unknown preset, the driver root where NVML is missing.
func (s *Flags) Open(ctx context.Context) (*Node, error) {
	cfg, src, err := s.ReadConfig(ctx)
	if err != nil {
		return nil, err
	}
	host, err := s.OpenHost(ctx)
	if err != nil {
		return nil, err
	}
	inv, err := Discover(ctx, host)
	if err != nil {
		_ = host.Close() // the discovery's error says what is wrong
		return nil, err
	}
	plan, err := NewPlan(inv, cfg, src)
	if err != nil {
		_ = host.Close() // the plan's error says what is wrong
		return nil, err
	}
	return &Node{Host: host, Inv: inv, Config: cfg, Source: src, Plan: plan}, nil
}

// OpenHost opens the node's GPUs: NVML, or the simulated node.
func (s *Flags) OpenHost(ctx context.Context) (*gpuhost.Host, error) {
	return gpuhost.Open(ctx, gpuhost.Options{Simulate: s.Simulate, NodeName: s.NodeName, DriverRoot: s.DriverRoot, DevRoot: s.devRoot(), SysfsRoot: s.SysfsRoot})
}

// devicesInDriverRoot reports whether the driver root holds the GPUs'
// device nodes, as a driver container makes them under its root.
func (s *Flags) devicesInDriverRoot() bool {
	if s.DriverRoot == "" || s.DriverRoot == "/" {
		return false
	}
	st, err := os.Stat(filepath.Join(s.DriverRoot, "dev/nvidiactl"))
	return err == nil && !st.IsDir()
}

// devRoot is where the plugin finds the device nodes: --dev-root when
// set, else the driver root when it holds them.
func (s *Flags) devRoot() string {
	if (s.DevRoot == "" || s.DevRoot == "/") && s.devicesInDriverRoot() {
		return s.DriverRoot
	}
	return s.DevRoot
}

// DeviceHostRoot is what device nodes' host paths start with: the driver
// root as the host sees it (hostDriverRoot, else the driver root) when the
// plugin finds the device nodes there, else the host's root. A CDI spec
// gives the numbers too; the device-plugin API gives only the host path,
// which the runtime stats.
func (s *Flags) DeviceHostRoot(hostDriverRoot string) string {
	if s.DriverRoot == "" || s.DriverRoot == "/" || s.devRoot() != s.DriverRoot {
		return "/"
	}
	if hostDriverRoot != "" {
		return hostDriverRoot
	}
	return s.DriverRoot
}

// Discover finds the host's GPUs and their links.
func Discover(ctx context.Context, host *gpuhost.Host) (*inventory.Inventory, error) {
	inv, err := inventory.Discover(ctx, host.NVML, host.PCIe)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	return inv, nil
}

// NewPlan plans the node's groups and seats; an error names the
// configuration's lines at fault where src has them.
func NewPlan(inv *inventory.Inventory, cfg *v1alpha1.NodeConfig, src *v1alpha1.Source) (*planner.Plan, error) {
	plan, err := planner.New(inv, cfg)
	if err != nil {
		var fe v1alpha1.FieldErrors
		if errors.As(err, &fe) && src != nil {
			err = src.Annotate(fe)
		}
		return nil, fmt.Errorf("node configuration does not fit this node (%s):\n%w", inv.Summary(), err)
	}
	return plan, nil
}

// ReadConfig reads the node configuration, or returns the defaults when
// none is given.
func (s *Flags) ReadConfig(ctx context.Context) (*v1alpha1.NodeConfig, *v1alpha1.Source, error) {
	if s.ConfigPath == "" {
		cfg := &v1alpha1.NodeConfig{}
		cfg.SetDefaults()
		return cfg, nil, nil
	}
	data, err := os.ReadFile(s.ConfigPath)
	if err != nil {
		return nil, nil, fmt.Errorf("read node configuration: %w", err)
	}
	cfg, src, err := v1alpha1.LoadNodeConfig(data, s.ConfigPath)
	if err != nil {
		return nil, nil, fmt.Errorf("node configuration is invalid:\n%w", err)
	}
	for _, note := range src.Notes {
		klog.FromContext(ctx).Info("Node configuration", "file", s.ConfigPath, "note", note)
	}
	return cfg, src, nil
}

// LogPlan logs what a daemon serves: the node and the plan's warnings.
func (n *Node) LogPlan(ctx context.Context) {
	logger := klog.FromContext(ctx)
	logger.Info("Node", "gpus", n.Inv.Summary(), "source", n.Host.Description)
	for _, w := range n.Plan.Warnings {
		logger.Info("Plan", "warning", w)
	}
}
