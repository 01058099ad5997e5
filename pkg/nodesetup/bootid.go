package nodesetup

import (
	"fmt"

	"github.com/kyb-ai/kyb-dra-driver/pkg/bootid"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
)

// BootIDFlag names the file holding the node's boot ID, which a daemon
// reads once at start and hands to every part that records state a
// reboot ends: the seat checkpoint, the MPS daemons' records and the MIG
// journal.
type BootIDFlag struct {
	File string
}

// AddFlags defines --boot-id-file.
func (b *BootIDFlag) AddFlags(f *cli.FlagSet) {
	f.StringVar(&b.File, "boot-id-file", "KYB_BOOT_ID_FILE", bootid.File, "file holding the node's boot ID, read once at start: the seat checkpoint, the MPS daemons' records and the MIG journal tell a reboot by it")
}

// Read reads the boot ID.
func (b *BootIDFlag) Read() (string, error) {
	id, err := bootid.Read(b.File)
	if err != nil {
		return "", fmt.Errorf("--boot-id-file %s: %w", b.File, err)
	}
	return id, nil
}
