// Command kyb-device-plugin is the kyb device-plugin shim, for clusters
// without DRA: it serves the node's GPU seats as extended resources
// through the kubelet's device-plugin API. `mps-control-sim` is the MPS
// daemon of a simulated node (package mpssim), which the shim runs from its
// own binary.
package main

import (
	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-device-plugin/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"
)

func main() { cli.Main(app.Run, cli.Hidden{Name: mpssim.Command, Main: mpssim.Main}) }
