package inventory

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SysfsPCIe reads PCIe placement from the kernel's sysfs. Root is the sysfs
// mount point: /sys on the host, or wherever the plugin's container mounts it.
type SysfsPCIe struct {
	Root string
}

// PCIeRoot returns the root complex of a PCI device, as the kernel names it
// ("pci0000:00"): the first component of its canonical sysfs path.
func (s SysfsPCIe) PCIeRoot(busID string) (string, error) {
	link := filepath.Join(s.root(), "bus", "pci", "devices", busID)
	target, err := filepath.EvalSymlinks(link)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", link, err)
	}
	devices := filepath.Join(s.root(), "devices") + string(filepath.Separator)
	rest, ok := strings.CutPrefix(target, devices)
	if !ok {
		// EvalSymlinks resolved the root itself too; compare on the tail.
		idx := strings.Index(target, "/devices/pci")
		if idx < 0 {
			return "", fmt.Errorf("%s: %s is not under a PCI root", busID, target)
		}
		rest = target[idx+len("/devices/"):]
	}
	root, _, _ := strings.Cut(rest, string(filepath.Separator))
	if !strings.HasPrefix(root, "pci") {
		return "", fmt.Errorf("%s: %s is not under a PCI root", busID, target)
	}
	return root, nil
}

// NUMANode reads the device's NUMA node; -1 when the platform has none.
func (s SysfsPCIe) NUMANode(busID string) (int, error) {
	p := filepath.Join(s.root(), "bus", "pci", "devices", busID, "numa_node")
	b, err := os.ReadFile(p)
	if err != nil {
		return -1, fmt.Errorf("read %s: %w", p, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1, fmt.Errorf("read %s: %w", p, err)
	}
	return n, nil
}

func (s SysfsPCIe) root() string {
	if s.Root == "" {
		return "/sys"
	}
	return s.Root
}
