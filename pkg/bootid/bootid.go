// Package bootid reads the node's boot ID, which tells one boot from the
// next: what a daemon recorded in an earlier boot (the CDI specs of
// prepared claims on a tmpfs, an MPS daemon's PID, a MIG instance) did not
// outlive the reboot. A daemon reads it once at start and hands it to
// every part that records such state, so that all of them agree on the
// boot, and a test (or a node whose /proc is elsewhere) names another file
// once (--boot-id-file).
package bootid

import (
	"fmt"
	"os"
	"strings"
)

// File is the kernel's: a random UUID chosen at each boot.
const File = "/proc/sys/kernel/random/boot_id"

// Read returns the boot ID in path. A file that cannot be read, or that
// is empty, is an error: a daemon that cannot tell one boot from the next
// could take a record of an earlier boot for one of this boot.
func Read(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the node's boot ID: %w", err)
	}
	id := strings.TrimSpace(string(raw))
	if id == "" {
		return "", fmt.Errorf("read the node's boot ID: %s is empty", path)
	}
	return id, nil
}
