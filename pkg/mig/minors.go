package mig

import (
	"fmt"
	"strconv"
	"strings"
)

// Minors is what /proc/driver/nvidia-caps/mig-minors says: the minor of
// the capability device node (/dev/nvidia-caps/nvidia-cap<minor>) behind
// each MIG capability. The kernel module writes a line for every GPU
// instance and compute instance ID a GPU could have, whether it exists or
// not.
type Minors struct {
	// Config and Monitor are the administrators' capabilities (config,
	// monitor lines); 0 when the file has none.
	Config  int
	Monitor int
	access  map[CapabilityKey]int
}

// CapabilityKey names a MIG access capability: GPU gpuN, GPU instance
// giM, and compute instance ciK, or CI -1 for the GPU instance's own.
type CapabilityKey struct {
	GPU, GI, CI int
}

func (k CapabilityKey) String() string {
	if k.CI < 0 {
		return fmt.Sprintf("gpu%d/gi%d/access", k.GPU, k.GI)
	}
	return fmt.Sprintf("gpu%d/gi%d/ci%d/access", k.GPU, k.GI, k.CI)
}

// GPUInstance is the minor of a GPU instance's access capability.
func (m Minors) GPUInstance(gpu, gi int) (int, bool) {
	minor, ok := m.access[CapabilityKey{GPU: gpu, GI: gi, CI: -1}]
	return minor, ok
}

// ComputeInstance is the minor of a compute instance's access capability.
func (m Minors) ComputeInstance(gpu, gi, ci int) (int, bool) {
	minor, ok := m.access[CapabilityKey{GPU: gpu, GI: gi, CI: ci}]
	return minor, ok
}

// Len is the number of access capabilities listed.
func (m Minors) Len() int { return len(m.access) }

// ParseMinors reads the mig-minors file: lines "config 1", "monitor 2",
// "gpu0/gi1/access 12", "gpu0/gi1/ci0/access 13". name says where the
// data came from; errors name it and the line.
func ParseMinors(data []byte, name string) (Minors, error) {
	m := Minors{access: map[CapabilityKey]int{}}
	seen := map[int]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return Minors{}, fmt.Errorf("%s:%d: want a capability and a minor, got %q", name, i+1, line)
		}
		minor, err := strconv.Atoi(fields[1])
		if err != nil || minor < 0 {
			return Minors{}, fmt.Errorf("%s:%d: minor %q is not a number", name, i+1, fields[1])
		}
		if prev, dup := seen[minor]; dup {
			return Minors{}, fmt.Errorf("%s:%d: minor %d is %s's already", name, i+1, minor, prev)
		}
		seen[minor] = fields[0]
		switch fields[0] {
		case "config":
			m.Config = minor
		case "monitor":
			m.Monitor = minor
		default:
			key, err := parseCapability(fields[0])
			if err != nil {
				return Minors{}, fmt.Errorf("%s:%d: %w", name, i+1, err)
			}
			if _, dup := m.access[key]; dup {
				return Minors{}, fmt.Errorf("%s:%d: %s is listed twice", name, i+1, key)
			}
			m.access[key] = minor
		}
	}
	return m, nil
}

// parseCapability reads gpuN/giM/access or gpuN/giM/ciK/access.
func parseCapability(s string) (CapabilityKey, error) {
	parts := strings.Split(s, "/")
	if (len(parts) != 3 && len(parts) != 4) || parts[len(parts)-1] != "access" {
		return CapabilityKey{}, fmt.Errorf("capability %q is not config, monitor, gpuN/giM/access or gpuN/giM/ciK/access", s)
	}
	key := CapabilityKey{CI: -1}
	var err error
	if key.GPU, err = numbered(parts[0], "gpu"); err != nil {
		return CapabilityKey{}, fmt.Errorf("capability %q: %w", s, err)
	}
	if key.GI, err = numbered(parts[1], "gi"); err != nil {
		return CapabilityKey{}, fmt.Errorf("capability %q: %w", s, err)
	}
	if len(parts) == 4 {
		if key.CI, err = numbered(parts[2], "ci"); err != nil {
			return CapabilityKey{}, fmt.Errorf("capability %q: %w", s, err)
		}
	}
	return key, nil
}

// numbered reads "gi12" as 12 given the prefix "gi".
func numbered(s, prefix string) (int, error) {
	digits, ok := strings.CutPrefix(s, prefix)
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n < 0 || digits != strconv.Itoa(n) {
		return 0, fmt.Errorf("%q is not %s followed by a number", s, prefix)
	}
	return n, nil
}
