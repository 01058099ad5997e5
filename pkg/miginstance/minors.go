package miginstance

import (
	"fmt"
	"sync"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// minors is the mig-minors file, which names the capability device nodes
// of every GPU and compute instance ID a GPU could have. It is read once:
// the kernel module writes it when it loads. It has a lock of its own
// because Lookup holds no other.
type minors struct {
	read func() ([]byte, error)

	mu     sync.Mutex
	parsed *mig.Minors
}

// load reads the file, unless it was read already.
func (c *minors) load() (*mig.Minors, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.parsed != nil {
		return c.parsed, nil
	}
	raw, err := c.read()
	if err != nil {
		return nil, fmt.Errorf("read the MIG capability minors: %w", err)
	}
	mm, err := mig.ParseMinors(raw, "mig-minors")
	if err != nil {
		return nil, err
	}
	c.parsed = &mm
	return c.parsed, nil
}

// instance is a Created or Adopted record's instance, with its
// capability nodes.
func (c *minors) instance(r Record) (Instance, error) {
	minors, err := c.load()
	if err != nil {
		return Instance{}, err
	}
	giMinor, ok := minors.GPUInstance(r.GPUMinor, r.GI)
	if !ok {
		return Instance{}, fmt.Errorf("mig-minors lists no gpu%d/gi%d/access", r.GPUMinor, r.GI)
	}
	ciMinor, ok := minors.ComputeInstance(r.GPUMinor, r.GI, r.CI)
	if !ok {
		return Instance{}, fmt.Errorf("mig-minors lists no gpu%d/gi%d/ci%d/access", r.GPUMinor, r.GI, r.CI)
	}
	return Instance{GI: r.GI, CI: r.CI, UUID: r.UUID, CapabilityNodes: []string{
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", giMinor),
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", ciMinor),
	}}, nil
}
