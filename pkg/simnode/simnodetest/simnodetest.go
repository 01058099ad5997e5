// Package simnodetest gives a test a simulated node in one call: the
// simulated NVML, the inventory that discovery reads from it, and the plan
// of a node configuration. It is for tests only; no binary links it
// (hack/deps-check.sh).
package simnodetest

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// Node is a simulated node and what the driver makes of it.
type Node struct {
	Sim    *simnode.Node
	Inv    *inventory.Inventory
	Config *v1alpha1.NodeConfig
	Plan   *planner.Plan
}

// Inventory loads preset (or a NodeTopology file) as node nodeName and
// discovers its GPUs, failing the test on any error.
func Inventory(tb testing.TB, preset, nodeName string) (*simnode.Node, *inventory.Inventory) {
	tb.Helper()
	sim, err := simnode.Load(preset, nodeName)
	if err != nil {
		tb.Fatalf("load simulated node %s: %v", preset, err)
	}
	inv, err := inventory.Discover(context.Background(), sim.NVML(), sim.PCIe())
	if err != nil {
		tb.Fatalf("discover the GPUs of %s: %v", preset, err)
	}
	return sim, inv
}

// MIGModel reads the MIG geometry of a GPU of a simulated node through
// NVML, as discovery does, failing the test where there is none.
func MIGModel(tb testing.TB, dev nvml.Device) mig.Model {
	tb.Helper()
	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		tb.Fatalf("GetName: %v", ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		tb.Fatalf("GetMemoryInfo: %v", ret)
	}
	m, err := mig.Read(dev, name, mem.Total)
	if err != nil {
		tb.Fatalf("read the MIG geometry of %s: %v", name, err)
	}
	return m
}

// Config decodes a node configuration; "" is the defaults (nil).
func Config(tb testing.TB, config string) *v1alpha1.NodeConfig {
	tb.Helper()
	if config == "" {
		return nil
	}
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(config), "test.yaml")
	if err != nil {
		tb.Fatalf("load node configuration: %v", err)
	}
	return cfg
}

// New is node-1 of preset planned with config ("" for the defaults).
func New(tb testing.TB, preset, config string) *Node {
	tb.Helper()
	sim, inv := Inventory(tb, preset, "node-1")
	cfg := Config(tb, config)
	plan, err := planner.New(inv, cfg)
	if err != nil {
		tb.Fatalf("plan %s: %v", preset, err)
	}
	return &Node{Sim: sim, Inv: inv, Config: cfg, Plan: plan}
}
