// Command kyb-dra-plugin is the kyb DRA kubelet plugin. Run without a
// subcommand it serves the node; `plan` prints what it would publish.
// `mps-control-sim` is the MPS daemon of a simulated node (package
// mpssim), which the plugin runs from its own binary; the help does not
// list it, since only the plugin runs it.
package main

import (
	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-dra-plugin/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"
)

func main() { cli.Main(app.Run, cli.Hidden{Name: mpssim.Command, Main: mpssim.Main}) }
