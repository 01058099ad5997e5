package command

import (
	"fmt"
	"io"
)

// writeDRAObjects prints the DRA objects of a plan.
func writeDRAObjects(w io.Writer, kind, nodeName string, node *loaded) error {
	return fmt.Errorf("-o %s is not available yet", kind)
}
