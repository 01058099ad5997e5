package mig_test

import (
	"slices"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// A configuration names a MIG profile by the name the plugin derives
// (mig: {profile: 1g.10gb}), and Model.Profile returns the first profile
// of that name. Two profiles NVML describes apart (other indices, IDs and
// placements) that the derivation names alike must not both be read: the
// configuration could then reach only one of them, and which one would be
// an accident of their order. The conformance suite fails such a GPU
// ("both named"); Read, which the plugin runs, takes it.
func TestReadRefusesTwoProfilesOfOneName(t *testing.T) {
	node := load(t, `gpus:
- index: 0
  productName: NVIDIA Odd
  architecture: hopper
  cudaComputeCapability: "9.0"
  memoryMiB: 40960
  mig:
    profiles:
    - {index: 0, id: 19, sliceCount: 1, instanceCount: 7, multiprocessorCount: 16, memorySizeMB: 5200, placements: {starts: [0, 1, 2, 3, 4, 5, 6], size: 1}}
    - {index: 9, id: 15, sliceCount: 1, instanceCount: 4, multiprocessorCount: 26, memorySizeMB: 10240, placements: {starts: [0, 2, 4, 6], size: 2}}
    - {index: 4, id: 0, sliceCount: 7, instanceCount: 1, multiprocessorCount: 132, memorySizeMB: 40960, placements: {starts: [0], size: 8}}
`)
	dev, name, mem := device(t, node, 0)
	m, err := mig.Read(dev, name, mem)
	if err != nil {
		return // refused: the configuration cannot pick one by accident
	}
	names := m.ProfileNames()
	for i, n := range names {
		if slices.Contains(names[:i], n) {
			p, _ := m.Profile(n)
			t.Errorf("Read gives two profiles the name %s (profiles %v); mig: {profile: %s} reaches only profile ID %d", n, names, n, p.ID)
		}
	}
}
