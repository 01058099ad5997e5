package v1alpha1

import "testing"

// A kernel gives each driver a major of its own, and Validate refuses a
// uvmMajor and a capsMajor that are one. But it runs before the defaults
// (uvm 511, caps 238), so a description that sets only one of them, to
// the other's default, gets both on one major: a node described after
// the real H200 (nvidia-uvm 238) whose capsMajor is left out lists
// nvidia-uvm and nvidia-caps at 238, and its MIG capability nodes share
// the UVM nodes' numbers.
func TestAMajorSetToTheOthersDefaultIsRefused(t *testing.T) {
	for _, set := range []string{"uvmMajor: 238", "capsMajor: 511"} {
		doc := "apiVersion: kyb.ai/v1alpha1\nkind: NodeTopology\n" + set + `
gpus:
- {index: 0, pciBusID: "0000:18:00.0", productName: NVIDIA H200, architecture: hopper, cudaComputeCapability: "9.0", memoryMiB: 143771}
`
		topo, err := LoadNodeTopology([]byte(doc), "node.yaml")
		if err != nil {
			continue // refused, naming the field
		}
		if *topo.UVMMajor == *topo.CapsMajor {
			t.Errorf("%s: nvidia-uvm and nvidia-caps both get major %d", set, *topo.UVMMajor)
		}
	}
}
