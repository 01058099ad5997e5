// Command kyb-device-plugin is the kyb device-plugin shim, for clusters
// without DRA: it serves the node's GPU seats as extended resources
// through the kubelet's device-plugin API. `mps-control-sim` is the MPS
// daemon of a simulated node (package mpssim), which the shim runs from its
// own binary.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-device-plugin/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == mpssim.Command {
		os.Exit(mpssim.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	// SIGTERM cancels the context; the shim then removes its sockets, so
	// the kubelet sees its resources go at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
